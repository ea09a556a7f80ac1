"""Selection and dispatch: registry, availability probes, selection policy, resolution."""
