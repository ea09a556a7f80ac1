"""Kernel adapters: each takes an op's standard arguments and calls one ``torch_npu`` operator."""
