"""A TEST DOUBLE of ``sgl_kernel``: its documented kernel semantics in PyTorch, on the CPU.

Not the real SDK. It stands in for ``sgl_kernel`` in ``sys.modules`` so the adapters can be
checked here, without a GPU: same function names, argument order, in-place writes and return
values as sgl_kernel's Python API (``sgl_kernel/elementwise.py``, 0.4.x), and the same
preconditions the CUDA kernels rely on (dtype, contiguity, int64 positions, cache dtype, at
least one row for the kernels that launch one CUDA block per row), which it turns into
``AssertionError`` where the real kernel would throw or read garbage. Every call is recorded
in :attr:`SglKernelDouble.calls`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, *HALF)


class SglKernelDouble(types.ModuleType):
    """``sgl_kernel`` stand-in: the act-and-mul, (Gemma) RMS norm and rope kernels."""

    def __init__(self) -> None:
        super().__init__("sgl_kernel")
        self.__version__ = "0.0.0+double"
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def silu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(("silu_and_mul", (input, out)))
        return _act_and_mul(F.silu, input, out)

    def gelu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(("gelu_and_mul", (input, out)))
        return _act_and_mul(F.gelu, input, out)

    def gelu_tanh_and_mul(
        self, input: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.calls.append(("gelu_tanh_and_mul", (input, out)))
        return _act_and_mul(lambda gate: F.gelu(gate, approximate="tanh"), input, out)

    def rmsnorm(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        out: torch.Tensor | None = None,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor:
        self.calls.append(("rmsnorm", (input, weight, eps, out)))
        _check_norm_operands(input, weight)
        assert input.dtype in HALF, f"rmsnorm kernel is built for fp16/bf16, got {input.dtype}"
        if out is None:
            out = torch.empty_like(input)
        out.copy_(_normalise(input.float(), weight, eps).to(input.dtype))
        return out

    def fused_add_rmsnorm(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        enable_pdl: bool | None = None,
    ) -> None:
        self.calls.append(("fused_add_rmsnorm", (input, residual, weight, eps)))
        _check_norm_operands(input, weight)
        assert input.dtype in FLOATS
        assert residual.shape == input.shape
        assert residual.dtype == input.dtype
        assert residual.is_contiguous()
        total = input.float() + residual.float()
        residual.copy_(total)  # step 1: residual += input
        input.copy_(_normalise(total, weight, eps))  # step 2: input = norm(residual) * weight

    def gemma_rmsnorm(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        out: torch.Tensor | None = None,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor:
        self.calls.append(("gemma_rmsnorm", (input, weight, eps, out)))
        _check_norm_operands(input, weight)
        # FlashInfer's csrc/norm.cu: DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FP16, no float32 kernel.
        assert input.dtype in HALF, f"gemma_rmsnorm is built for fp16/bf16, got {input.dtype}"
        if out is None:
            out = torch.empty_like(input)
        out.copy_(_normalise(input.float(), 1.0 + weight.float(), eps).to(input.dtype))
        return out

    def gemma_fused_add_rmsnorm(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        enable_pdl: bool | None = None,
    ) -> None:
        self.calls.append(("gemma_fused_add_rmsnorm", (input, residual, weight, eps)))
        _check_norm_operands(input, weight)
        assert input.dtype in HALF, f"gemma kernels are built for fp16/bf16, got {input.dtype}"
        assert residual.shape == input.shape
        assert residual.dtype == input.dtype
        assert residual.is_contiguous(), "CHECK_INPUT(residual) in FlashInfer's csrc/norm.cu"
        total = input.float() + residual.float()
        residual.copy_(total)  # step 1: residual += input
        input.copy_(_normalise(total, 1.0 + weight.float(), eps))  # step 2, scale 1 + weight

    def rotary_embedding(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool = True,
    ) -> None:
        self.calls.append(
            ("rotary_embedding", (positions, query, key, head_size, cos_sin_cache, is_neox))
        )
        assert positions.dtype == torch.int64
        assert positions.dim() == 1
        assert positions.is_contiguous()
        num_tokens = positions.shape[0]
        assert query.shape[0] == num_tokens
        assert key is None or key.shape[0] == num_tokens
        assert query.dtype in FLOATS
        assert cos_sin_cache.dtype == query.dtype
        assert cos_sin_cache.dim() == 2
        assert cos_sin_cache.is_contiguous()
        rot_dim = cos_sin_cache.shape[1]
        # As the kernel addresses memory: token stride from dim 0, the QUERY's head stride for
        # both tensors (head_size only counts the heads), unit stride in the last dim.
        head_stride = query.stride(-2) if query.dim() == 3 else head_size
        cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        for tensor in (query, key):
            if tensor is None:
                continue
            assert tensor.stride(-1) == 1, "kernel assumes a unit stride in the last dim"
            assert tensor.numel() // num_tokens % head_size == 0
            heads = tensor.numel() // num_tokens // head_size
            rotated = tensor.as_strided(
                (num_tokens, heads, rot_dim), (tensor.stride(0), head_stride, 1)
            )
            rotated.copy_(_rotate(rotated, cos, sin, is_neox))


def _check_launch(rows: int) -> None:
    """The norm and act-and-mul kernels launch one CUDA block per row (FlashInfer's
    csrc/norm.cu, csrc/activation.cu): a grid of 0 blocks is an invalid launch configuration
    (CUDA C++ Programming Guide, execution configuration; cudaErrorInvalidConfiguration)."""
    assert rows > 0, "an empty batch is an invalid (0-block) kernel launch"


def _act_and_mul(
    act: Callable[[torch.Tensor], torch.Tensor], input: torch.Tensor, out: torch.Tensor | None
) -> torch.Tensor:
    """sgl_kernel's act-and-mul wrappers (elementwise.py) and FlashInfer's kernel."""
    if input.shape[-1] * input.dtype.itemsize % 16 != 0:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    d = input.shape[-1] // 2
    if out is None:
        out = torch.empty((*input.shape[:-1], d), dtype=input.dtype, device=input.device)
    assert input.shape[:-1] == out.shape[:-1]
    assert input.shape[-1] == 2 * out.shape[-1]
    assert input.dtype in FLOATS
    assert out.dtype == input.dtype
    assert input.is_contiguous(), "kernel reads packed rows"
    assert out.is_contiguous(), "kernel writes packed rows"
    _check_launch(input.numel() // max(input.shape[-1], 1))
    # act in float32, rounded to the dtype, then multiplied in the dtype (act_and_mul).
    out.copy_(act(input[..., :d].float()).to(input.dtype) * input[..., d:])
    return out


def _check_norm_operands(input: torch.Tensor, weight: torch.Tensor) -> None:
    assert input.dim() == 2, "norm kernels take [batch, hidden]"
    assert input.is_contiguous(), "norm kernels read packed rows"
    _check_launch(input.shape[0])
    assert weight.dim() == 1
    assert weight.shape[0] == input.shape[1]
    assert weight.dtype == input.dtype, "kernel reads the weight as the input's element type"


def _normalise(total: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = total.pow(2).mean(dim=-1, keepdim=True)
    return total * torch.rsqrt(variance + eps) * weight.float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """The kernel's per-element arithmetic, in the tensor's dtype."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
