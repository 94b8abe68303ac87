"""Six Shakespeare plays, public domain (see PROVENANCE.md)."""
