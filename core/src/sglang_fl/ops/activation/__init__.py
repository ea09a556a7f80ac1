"""Activation ops: the gated ``*_and_mul`` family and the element-wise GELU variants."""
