"""Dispatch: the registry of implementations, the selection policy and the resolution of one op."""
