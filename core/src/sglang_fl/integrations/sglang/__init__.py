"""SGLang integration: the ``sglang.srt.plugins`` and ``sglang.srt.platforms`` entry points.

``plugin.register`` routes SGLang's ``SiluAndMul``, ``RMSNorm`` and ``RotaryEmbedding`` through
bridges to the implementations sglang-fl chose; ``platform.activate`` offers a vendor's
platform, or the built-in CPU platform on a machine without an in-tree accelerator. Nothing
here imports SGLang until SGLang calls one of them.
"""
