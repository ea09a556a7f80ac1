"""template kernel adapters: one function per op, taking the op's standard arguments."""
