"""Normalization ops: RMSNorm (with its fused residual add), Gemma's RMSNorm, LayerNorm."""
