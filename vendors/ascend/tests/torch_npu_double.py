"""A TEST DOUBLE of ``torch_npu``: its documented operator semantics in PyTorch, on the CPU.

Not the real SDK (which must never be installed here: without CANN it breaks ``import torch``).
It stands in for ``torch_npu`` in ``sys.modules`` with the operators SGLang's ``forward_npu``
methods call, their argument order and return tuples (torch_npu / CANN operator docs):
``npu_swiglu``, ``npu_rms_norm`` -> ``(y, rstd)``, ``npu_add_rms_norm`` -> ``(y, rstd, x1 + x2)``,
``npu_mrope`` -> ``(query, key)``, and ``npu.device_count()``. Every operator returns new
tensors and never writes its inputs. Preconditions become ``AssertionError``. Each call is
recorded in :attr:`TorchNpuDouble.calls`.
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
        assert positions.dim() == 1, "plain rope: positions [num_tokens]"
        assert positions.dtype in (torch.int32, torch.int64)
        assert mrope_section in (None, [0, 0, 0]), "1-D positions take no mrope sections"
        assert rotary_mode in ("half", "interleave")
        assert query.dim() == 2, "npu_mrope takes [num_tokens, heads * head_size]"
        assert key.dim() == 2, "npu_mrope takes [num_tokens, heads * head_size]"
        assert query.dtype in FLOATS
        assert cos_sin_cache.dtype == query.dtype
        rotary_dim = cos_sin_cache.shape[-1]
        assert rotary_dim <= head_size
        cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
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
