"""Incentive schemes behind one interface (base.Incentive), the update verifier, and the
double-entry ledger they write to. Strategies compose the incentive they need."""
