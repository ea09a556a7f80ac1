"""A TEST DOUBLE of ``torch_npu``: its documented operator semantics in PyTorch, on the CPU.

Not the real SDK (which must never be installed here: without CANN it breaks ``import torch``).
It stands in for ``torch_npu`` in ``sys.modules`` with the operators SGLang's ``forward_npu``
methods call, their argument order and return tuples (torch_npu / CANN operator docs):
``npu_swiglu``, ``npu_geglu`` -> ``(y, gelu)``, ``npu_gelu``, ``npu_fast_gelu``,
``npu_rms_norm`` -> ``(y, rstd)``, ``npu_add_rms_norm`` -> ``(y, rstd, x1 + x2)``,
``npu_mrope`` -> ``(query, key)`` (plain rope with ``[tokens]`` positions, mrope sections with
``[3, tokens]``), and ``npu.device_count()``. Every operator returns new tensors and never
writes its inputs. Preconditions become ``AssertionError``. Each call is recorded in
:attr:`TorchNpuDouble.calls`.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class TorchNpuDouble(types.ModuleType):
    """``torch_npu`` stand-in with ``devices`` visible NPUs."""

    def __init__(self, devices: int = 1) -> None:
        super().__init__("torch_npu")
        self.__version__ = "0.0.0+double"
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.npu = types.SimpleNamespace(device_count=lambda: devices)

    def npu_swiglu(self, input: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls.append(("npu_swiglu", (input,), {"dim": dim}))
        assert input.dtype in FLOATS
        a, b = input.chunk(2, dim=dim)
        return (F.silu(a.float()) * b.float()).to(input.dtype)

    def npu_geglu(
        self, input: torch.Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gelu(a) * b, gelu(a))`` for halves ``a, b`` of ``dim`` (``activate_left=False``
        gates the right half); ``approximate`` 0 is erf, 1 tanh (torch_npu.npu_geglu docs)."""
        self.calls.append(
            (
                "npu_geglu",
                (input,),
                {"dim": dim, "approximate": approximate, "activate_left": activate_left},
            )
        )
        assert input.dtype in FLOATS
        assert approximate in (0, 1), "approximate: 0 (erf) or 1 (tanh)"
        assert input.shape[dim] % 2 == 0, "the split dim must be even"
        left, right = input.chunk(2, dim=dim)
        gate, value = (left, right) if activate_left else (right, left)
        gelu = F.gelu(gate.float(), approximate="tanh" if approximate else "none")
        return (gelu * value.float()).to(input.dtype), gelu.to(input.dtype)

    def npu_gelu(self, input: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
        self.calls.append(("npu_gelu", (input,), {"approximate": approximate}))
        assert input.dtype in FLOATS
        assert approximate in ("none", "tanh"), "torch_npu.npu_gelu: 'none' or 'tanh'"
        assert input.dim() <= 8, "torch_npu.npu_gelu: at most 8 dimensions"
        return F.gelu(input.float(), approximate=approximate).to(input.dtype)

    def npu_fast_gelu(self, input: torch.Tensor) -> torch.Tensor:
        """``x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|))`` (torch_npu.npu_fast_gelu docs)."""
        self.calls.append(("npu_fast_gelu", (input,), {}))
        assert input.dtype in FLOATS
        x = input.float()
        return (x / (1 + torch.exp(-1.702 * x.abs())) * torch.exp(0.851 * (x - x.abs()))).to(
            input.dtype
        )

    def npu_rms_norm(
        self, input: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(("npu_rms_norm", (input, gamma, epsilon), {}))
        _check_norm(input, gamma)
        return _rms_norm(input.float(), gamma, epsilon, input.dtype)

    def npu_add_rms_norm(
        self, x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.calls.append(("npu_add_rms_norm", (x1, x2, gamma, epsilon), {}))
        _check_norm(x2, gamma)
        assert x1.shape == x2.shape
        assert x1.dtype == x2.dtype
        total = x1.float() + x2.float()
        y, rstd = _rms_norm(total, gamma, epsilon, x1.dtype)
        return y, rstd, total.to(x1.dtype)

    def npu_mrope(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        head_size: int,
        *,
        mrope_section: list[int] | None = None,
        rotary_mode: str = "half",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(
            (
                "npu_mrope",
                (positions, query, key, cos_sin_cache, head_size),
                {"mrope_section": mrope_section, "rotary_mode": rotary_mode},
            )
        )
        assert positions.dtype in (torch.int32, torch.int64)
        assert rotary_mode in ("half", "interleave")
        assert query.dim() == 2, "npu_mrope takes [num_tokens, heads * head_size]"
        assert key.dim() == 2, "npu_mrope takes [num_tokens, heads * head_size]"
        assert query.dtype in FLOATS
        assert cos_sin_cache.dtype == query.dtype
        rotary_dim = cos_sin_cache.shape[-1]
        assert rotary_dim <= head_size
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
        if positions.dim() == 1:
            assert mrope_section in (None, [0, 0, 0]), "1-D positions take no mrope sections"
        else:
            # CANN aclnnRopeWithSinCosCache, mrope mode: positions [3, numTokens]; axis i
            # supplies lanes sum(section[:i]) .. sum(section[:i + 1]) of cos and sin.
            assert positions.dim() == 2
            assert positions.shape[0] == 3, "mrope positions are [3, num_tokens]"
            assert mrope_section is not None
            assert len(mrope_section) == 3
            assert sum(mrope_section) == rotary_dim // 2, "sections cover rotary_dim // 2 lanes"
            cos, sin = (
                torch.cat([part[i] for i, part in enumerate(t.split(mrope_section, -1))], -1)
                for t in (cos, sin)
            )
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return tuple(  # type: ignore[return-value]
            _rope(x, cos, sin, head_size, rotary_dim, rotary_mode == "half") for x in (query, key)
        )


def _check_norm(input: torch.Tensor, gamma: torch.Tensor) -> None:
    assert input.dtype in FLOATS
    assert gamma.shape == input.shape[-1:]
    assert gamma.dtype == input.dtype, "gamma takes the input dtype"


def _rms_norm(
    total: torch.Tensor, gamma: torch.Tensor, epsilon: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = torch.rsqrt(total.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (total * rstd * gamma.float()).to(dtype), rstd


def _rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_size: int,
    rotary_dim: int,
    neox: bool,
) -> torch.Tensor:
    assert x.shape[1] % head_size == 0
    heads = x.reshape(x.shape[0], -1, head_size).clone()
    rot = heads[..., :rotary_dim]
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rot.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rot.copy_(torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2))
    return heads.reshape(x.shape)
