"""A TEST DOUBLE of ``sgl_kernel``: its documented kernel semantics in PyTorch, on the CPU.

Not the real SDK. It stands in for ``sgl_kernel`` in ``sys.modules`` so the adapters can be
checked here, without a GPU: same function names, argument order, in-place writes and return
values as sgl_kernel's Python API (``sgl_kernel/elementwise.py``, 0.4.x), and the same
preconditions the CUDA kernels rely on (dtype, contiguity, int64 positions, cache dtype), which
it turns into ``AssertionError`` where the real kernel would throw or read garbage. Every call
is recorded in :attr:`SglKernelDouble.calls`.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, *HALF)


class SglKernelDouble(types.ModuleType):
    """``sgl_kernel`` stand-in: ``silu_and_mul``, ``rmsnorm``, ``fused_add_rmsnorm``, rope,
    ``topk_softmax``, ``topk_sigmoid`` (``sgl_kernel/moe.py``)."""

    def __init__(self) -> None:
        super().__init__("sgl_kernel")
        self.__version__ = "0.0.0+double"
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def silu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(("silu_and_mul", (input, out)))
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
        # silu in float32, rounded to the dtype, then multiplied in the dtype (act_and_mul).
        out.copy_(F.silu(input[..., :d].float()).to(input.dtype) * input[..., d:])
        return out

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

    def topk_softmax(
        self,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        gating_output: torch.Tensor,
        renormalize: bool = False,
        moe_softcapping: float = 0.0,
        correction_bias: torch.Tensor | None = None,
    ) -> None:
        self.calls.append(("topk_softmax", (topk_weights, topk_ids, gating_output, renormalize)))
        _check_router_operands(topk_weights, topk_ids, gating_output, correction_bias)
        assert moe_softcapping == 0.0, "the double models the kernel without softcapping"
        _route(topk_weights, topk_ids, gating_output.float().softmax(dim=-1), renormalize)

    def topk_sigmoid(
        self,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        gating_output: torch.Tensor,
        renormalize: bool = False,
        correction_bias: torch.Tensor | None = None,
    ) -> None:
        self.calls.append(("topk_sigmoid", (topk_weights, topk_ids, gating_output, renormalize)))
        _check_router_operands(topk_weights, topk_ids, gating_output, correction_bias)
        _route(topk_weights, topk_ids, gating_output.float().sigmoid(), renormalize)


class SglangTritonMoeDouble(types.ModuleType):
    """A TEST DOUBLE of SGLang's ``moe_runner/triton_utils/fused_moe.py`` (SGLang 0.5.23): its
    ``outplace_fused_experts`` with the preconditions ``fused_experts_impl`` asserts, computed
    with PyTorch on the CPU. Calls are recorded in :attr:`calls`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def outplace_fused_experts(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        b1: torch.Tensor | None = None,
        b2: torch.Tensor | None = None,
        activation: str = "silu",
        is_gated: bool = True,
        **options: Any,
    ) -> torch.Tensor:
        self.calls.append(
            (
                "outplace_fused_experts",
                (hidden_states, w1, w2, topk_weights, topk_ids),
                {"activation": activation, "is_gated": is_gated, **options},
            )
        )
        # fused_experts_impl's assertions
        assert hidden_states.shape[1] == w1.shape[2], "Hidden size mismatch"
        assert topk_weights.shape == topk_ids.shape, "topk shape mismatch"
        assert hidden_states.is_contiguous(), "Hidden_states must be contiguous"
        assert w1.is_contiguous(), "Expert weights1 must be contiguous"
        assert w2.is_contiguous(), "Expert weights2 must be contiguous"
        assert hidden_states.dtype in FLOATS
        # float32 would run in TF32 (tl.dot's default precision): the double refuses to fake
        # a full-precision float32 result the real kernel does not give.
        assert hidden_states.dtype in HALF, "float32 runs in TF32 on the GPU"
        assert b1 is None
        assert b2 is None
        assert is_gated
        assert not options
        gate_up = torch.einsum("th,tkeh->tke", hidden_states.float(), w1.float()[topk_ids.long()])
        d = gate_up.shape[-1] // 2
        gate = gate_up[..., :d]
        act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
        hidden = (act * gate_up[..., d:]).to(hidden_states.dtype).float()
        down = torch.einsum("tki,tkhi->tkh", hidden, w2.float()[topk_ids.long()])
        return (down * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(hidden_states.dtype)


def _check_router_operands(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating_output: torch.Tensor,
    correction_bias: torch.Tensor | None,
) -> None:
    # SGLang 0.5.23 allocates the outputs so (topk.py, fused_topk): float32 weights, int32 ids.
    assert topk_weights.dtype == torch.float32
    assert topk_ids.dtype == torch.int32
    assert topk_weights.shape == topk_ids.shape
    assert gating_output.dim() == 2
    assert gating_output.shape[0] == topk_ids.shape[0]
    assert gating_output.shape[0] > 0, "a launch over no rows is an invalid grid"
    assert gating_output.is_contiguous(), "kernel reads packed rows"
    assert gating_output.dtype in FLOATS
    # sgl_kernel/moe.py docstring: "correction_bias ... must be float32 if provided"
    assert correction_bias is None or correction_bias.dtype == torch.float32


def _route(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, scores: torch.Tensor, renormalize: bool
) -> None:
    values, ids = torch.topk(scores, topk_ids.shape[1], dim=-1)
    if renormalize:
        values = values / values.sum(dim=-1, keepdim=True)
    topk_weights.copy_(values)
    topk_ids.copy_(ids)


def _check_norm_operands(input: torch.Tensor, weight: torch.Tensor) -> None:
    assert input.dim() == 2, "norm kernels take [batch, hidden]"
    assert input.is_contiguous(), "norm kernels read packed rows"
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
