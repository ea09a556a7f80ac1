"""Rotary position embeddings: the standard rope and the multimodal (sectioned) rope."""
