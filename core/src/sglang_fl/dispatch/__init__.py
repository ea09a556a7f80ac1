"""Dispatch: the registry of implementations, availability probes, the selection policy and the
resolution of one op."""
