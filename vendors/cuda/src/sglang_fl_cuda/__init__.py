"""sglang-fl backend for NVIDIA GPUs: SGLang's fused operators on ``sgl_kernel`` kernels.

Importing this package imports neither ``sgl_kernel`` nor anything CUDA-specific: the
``sgl_kernel`` import happens on the first availability probe (only when torch sees a CUDA
device) or the first kernel call.
"""

__version__ = "0.1.0"
