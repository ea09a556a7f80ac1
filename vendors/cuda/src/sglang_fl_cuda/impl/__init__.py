"""Kernel adapters: each takes an op's standard arguments and calls one ``sgl_kernel`` kernel."""
