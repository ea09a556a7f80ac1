"""Kernels SGLang's model code calls as plain functions, outside any fused-op layer."""
