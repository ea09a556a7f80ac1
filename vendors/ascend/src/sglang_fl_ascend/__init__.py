"""sglang-fl backend for Huawei Ascend NPUs: SGLang's fused operators on ``torch_npu`` kernels.

Importing this package never imports ``torch_npu``: on a machine without CANN that import
fails (or worse, breaks torch). It happens on the first availability probe or kernel call.
"""

__version__ = "0.1.0"
