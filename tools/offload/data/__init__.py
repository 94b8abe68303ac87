"""Vendored training corpus (see shakespeare/PROVENANCE.md)."""
