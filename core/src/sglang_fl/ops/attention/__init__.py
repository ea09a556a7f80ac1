"""Attention-side ops: what SGLang's attention path computes besides attention itself
(``clamp_position``, the decode positions that index the rope and KV caches)."""
