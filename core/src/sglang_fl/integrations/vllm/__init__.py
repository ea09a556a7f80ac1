"""vLLM integration: the ``vllm.general_plugins`` entry point routes vLLM's layers.

``plugin.register`` loads the same runtime as the SGLang integration (plugins, policy,
settings, dispatch report) and hooks ``CustomOp.dispatch_forward``, the method each vLLM layer
calls once, in its ``__init__``, to pick the forward it keeps. The op implementations are
shared with SGLang; only the bridges (vLLM's call arguments -> the standard signatures) are
vLLM's own. Nothing here imports vLLM until vLLM calls the entry point.
"""
