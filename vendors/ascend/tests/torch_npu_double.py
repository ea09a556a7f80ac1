"""A TEST DOUBLE of ``torch_npu``: its documented operator semantics in PyTorch, on the CPU.

Not the real SDK (which must never be installed here: without CANN it breaks ``import torch``).
It stands in for ``torch_npu`` in ``sys.modules`` with the operators SGLang's ``forward_npu``
methods call, their argument order and return tuples: ``npu_swiglu`` -> ``y``,
``npu_geglu`` -> ``(y, gelu)``, ``npu_gelu`` -> ``y``, ``npu_fast_gelu`` -> ``y``,
``npu_rms_norm`` -> ``(y, rstd)``, ``npu_add_rms_norm`` -> ``(y, rstd, x1 + x2)``,
``npu_mrope`` -> ``(query, key)`` (plain rope with ``[tokens]`` positions, mrope sections with
``[3, tokens]``), and ``npu.device_count()``. Every operator returns new
tensors and never writes its inputs. Every precondition the torch_npu API reference documents
for them is a :class:`~sglang_fl.testing.doubles.Constraint` naming that page; a call the real
operator would reject raises :class:`~sglang_fl.testing.doubles.ConstraintViolation`. Each call
is recorded in :attr:`TorchNpuDouble.calls`.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from sglang_fl.testing.doubles import Constraint, SdkDouble

FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# The torch_npu API reference pages (hiascend.com, PyTorch apiref); quoted where the page says
# it in so many words, else the section that states the constraint.
API_DOC = "torch_npu API reference (hiascend.com, PyTorch apiref), {}: {}"


class TorchNpuDouble(SdkDouble):
    """``torch_npu`` stand-in with ``devices`` visible NPUs."""

    # -- npu_swiglu(input, dim=-1) -> Tensor --------------------------------------------------
    SWIGLU_CONTIGUOUS = Constraint(
        "npu_swiglu",
        "a contiguous input",
        API_DOC.format("(beta)torch_npu.npu_swiglu", "input 不支持非连续的Tensor"),
    )
    SWIGLU_NOT_EMPTY = Constraint(
        "npu_swiglu",
        "a non-empty input",
        API_DOC.format("(beta)torch_npu.npu_swiglu", "input 不支持空Tensor"),
    )
    SWIGLU_SHAPE = Constraint(
        "npu_swiglu",
        "1 to 8 dims, the split dim of even size, float32/float16/bfloat16",
        API_DOC.format(
            "(beta)torch_npu.npu_swiglu",
            "shape支持1-8维, 且shape必须在入参dim对应维度上可以整除2; dtype支持fp32、fp16或bf16",
        ),
    )

    # -- npu_geglu(self, dim=-1, approximate=1, activate_left=False) -> (y, gelu) -------------
    # Its page says non-contiguous input is supported: no contiguity constraint.
    GEGLU_OPERANDS = Constraint(
        "npu_geglu",
        "float32/float16/bfloat16 input, dim in [-input.dim(), input.dim() - 1], approximate 0 "
        "(none) or 1 (tanh), the split dim halved into the outputs (even size)",
        API_DOC.format(
            "torch_npu.npu_geglu",
            "数据类型支持FLOAT32、FLOAT16、BFLOAT16; approximate 0表示使用none, 1表示使用tanh; "
            "out在dim维的size等于self在dim维size的1/2",
        ),
    )

    # -- npu_gelu(input, approximate='none') -> Tensor ---------------------------------------
    GELU_OPERANDS = Constraint(
        "npu_gelu",
        "float32/float16/bfloat16 input of at most 8 dims, approximate 'none' or 'tanh'",
        API_DOC.format(
            "torch_npu.npu_gelu",
            "输入最大支持8维; 数据类型支持FLOAT32、FLOAT16、BFLOAT16; approximate 可配置为"
            "'none'或者'tanh'",
        ),
    )

    # -- npu_fast_gelu(input) -> Tensor ------------------------------------------------------
    FAST_GELU_OPERANDS = Constraint(
        "npu_fast_gelu",
        "float32/float16/bfloat16 input",
        API_DOC.format("torch_npu.npu_fast_gelu", "parameter description of input (dtypes)"),
    )

    # -- npu_rms_norm(self, gamma, epsilon) -> (y, rstd); npu_add_rms_norm(x1, x2, gamma, eps) -
    RMS_NORM_OPERANDS = Constraint(
        "npu_rms_norm/npu_add_rms_norm",
        "float32/float16/bfloat16 input, gamma in its dtype and of its last dim's shape",
        API_DOC.format(
            "(beta)torch_npu.npu_rms_norm",
            "输入数据类型仅支持float16、bfloat16和float32; gamma 数据类型需要和self保持一致, 通常为"
            "self的最后一维",
        ),
    )
    ADD_RMS_NORM_PAIR = Constraint(
        "npu_add_rms_norm",
        "x1 and x2 of the same shape and dtype",
        API_DOC.format("torch_npu.npu_add_rms_norm", "parameter description of x1/x2"),
    )
    ADD_RMS_NORM_NOT_EMPTY = Constraint(
        "npu_add_rms_norm",
        "non-empty x1 and x2",
        API_DOC.format("torch_npu.npu_add_rms_norm", "parameter description: no empty tensor"),
    )

    # -- npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section,
    #             rotary_mode) -> (query, key) -----------------------------------------------
    MROPE_POSITIONS = Constraint(
        "npu_mrope",
        "int32/int64 positions of shape [num_tokens] with no mrope sections, or [3, num_tokens] "
        "with 3 sections summing to rotary_dim // 2, and as many query/key rows",
        API_DOC.format(
            "torch_npu.npu_mrope", "parameter description of positions and mrope_section"
        ),
    )
    MROPE_OPERANDS = Constraint(
        "npu_mrope",
        "2-D query/key [num_tokens, heads * head_size] in float32/float16/bfloat16, a cache in "
        "their dtype no wider than head_size, rotary_mode 'half' or 'interleave'",
        API_DOC.format("torch_npu.npu_mrope", "parameter description of query/key/cache"),
    )
    MROPE_ALIGNMENT = Constraint(
        "npu_mrope",
        "head_size and rotary_dim (the cache width) multiples of 32 for float16/bfloat16 and "
        "of 16 for float32",
        API_DOC.format("torch_npu.npu_mrope", "constraints section (head_size, rotary_dim)"),
    )

    def __init__(self, devices: int = 1) -> None:
        super().__init__("torch_npu")
        self.npu = types.SimpleNamespace(device_count=lambda: devices)

    def npu_swiglu(self, input: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.record("npu_swiglu", input, dim=dim)
        self.SWIGLU_CONTIGUOUS.check(input.is_contiguous(), f"strides {input.stride()}")
        self.SWIGLU_NOT_EMPTY.check(input.numel() > 0, f"shape {tuple(input.shape)}")
        self.SWIGLU_SHAPE.check(
            1 <= input.dim() <= 8 and input.shape[dim] % 2 == 0 and input.dtype in FLOATS,
            f"{tuple(input.shape)} {input.dtype}, dim {dim}",
        )
        a, b = input.chunk(2, dim=dim)
        return (F.silu(a.float()) * b.float()).to(input.dtype)

    def npu_geglu(
        self, input: torch.Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gelu(a) * b, gelu(a))`` for halves ``a, b`` of ``dim`` (``activate_left=False``
        gates the right half); ``approximate`` 0 is erf, 1 tanh."""
        self.record(
            "npu_geglu", input, dim=dim, approximate=approximate, activate_left=activate_left
        )
        rank = max(input.dim(), 1)
        self.GEGLU_OPERANDS.check(
            input.dtype in FLOATS
            and -rank <= dim < rank
            and approximate in (0, 1)
            and input.dim() > 0
            and input.shape[dim] % 2 == 0,
            f"{tuple(input.shape)} {input.dtype}, dim {dim}, approximate {approximate!r}",
        )
        left, right = input.chunk(2, dim=dim)
        gate, value = (left, right) if activate_left else (right, left)
        gelu = F.gelu(gate.float(), approximate="tanh" if approximate else "none")
        return (gelu * value.float()).to(input.dtype), gelu.to(input.dtype)

    def npu_gelu(self, input: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
        self.record("npu_gelu", input, approximate=approximate)
        self.GELU_OPERANDS.check(
            input.dtype in FLOATS and input.dim() <= 8 and approximate in ("none", "tanh"),
            f"{tuple(input.shape)} {input.dtype}, approximate {approximate!r}",
        )
        return F.gelu(input.float(), approximate=approximate).to(input.dtype)

    def npu_fast_gelu(self, input: torch.Tensor) -> torch.Tensor:
        """``x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|))``, its documented formula."""
        self.record("npu_fast_gelu", input)
        self.FAST_GELU_OPERANDS.check(input.dtype in FLOATS, f"{input.dtype}")
        x = input.float()
        return (x / (1 + torch.exp(-1.702 * x.abs())) * torch.exp(0.851 * (x - x.abs()))).to(
            input.dtype
        )

    def npu_rms_norm(
        self, input: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.record("npu_rms_norm", input, gamma, epsilon)
        self._check_norm(input, gamma)
        return _rms_norm(input.float(), gamma, epsilon, input.dtype)

    def npu_add_rms_norm(
        self, x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.record("npu_add_rms_norm", x1, x2, gamma, epsilon)
        self.ADD_RMS_NORM_PAIR.check(
            x1.shape == x2.shape and x1.dtype == x2.dtype,
            f"{tuple(x1.shape)} {x1.dtype} and {tuple(x2.shape)} {x2.dtype}",
        )
        self.ADD_RMS_NORM_NOT_EMPTY.check(x1.numel() > 0, f"shape {tuple(x1.shape)}")
        self._check_norm(x2, gamma)
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
        self.record(
            "npu_mrope",
            positions,
            query,
            key,
            cos_sin_cache,
            head_size,
            mrope_section=mrope_section,
            rotary_mode=rotary_mode,
        )
        rotary_dim = cos_sin_cache.shape[-1]
        plain = positions.dim() == 1 and mrope_section in (None, [0, 0, 0])
        sectioned = (
            positions.dim() == 2
            and positions.shape[0] == 3
            and mrope_section is not None
            and len(mrope_section) == 3
            and sum(mrope_section) == rotary_dim // 2
        )
        self.MROPE_POSITIONS.check(
            (plain or sectioned)
            and positions.dtype in (torch.int32, torch.int64)
            and query.shape[0] == key.shape[0] == positions.shape[-1],
            f"positions {positions.dtype} {tuple(positions.shape)}, sections {mrope_section}",
        )
        self.MROPE_OPERANDS.check(
            query.dim() == 2
            and key.dim() == 2
            and query.dtype in FLOATS
            and key.dtype == cos_sin_cache.dtype == query.dtype
            and rotary_dim <= head_size
            and query.shape[1] % head_size == 0
            and key.shape[1] % head_size == 0
            and rotary_mode in ("half", "interleave"),
            f"query {tuple(query.shape)} {query.dtype}, cache {tuple(cos_sin_cache.shape)} "
            f"{cos_sin_cache.dtype}, head_size {head_size}, rotary_mode {rotary_mode!r}",
        )
        alignment = 16 if query.dtype == torch.float32 else 32
        self.MROPE_ALIGNMENT.check(
            head_size % alignment == 0 and rotary_dim % alignment == 0,
            f"head_size {head_size}, rotary_dim {rotary_dim} in {query.dtype}",
        )
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
        if sectioned:
            # CANN aclnnRopeWithSinCosCache, mrope mode: axis i of positions [3, num_tokens]
            # supplies lanes sum(section[:i]) .. sum(section[:i + 1]) of cos and sin.
            assert mrope_section is not None
            cos, sin = (
                torch.cat([part[i] for i, part in enumerate(t.split(mrope_section, -1))], -1)
                for t in (cos, sin)
            )
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        neox = rotary_mode == "half"
        return (
            _rope(query, cos, sin, head_size, rotary_dim, neox),
            _rope(key, cos, sin, head_size, rotary_dim, neox),
        )

    def _check_norm(self, input: torch.Tensor, gamma: torch.Tensor) -> None:
        self.RMS_NORM_OPERANDS.check(
            input.dtype in FLOATS
            and gamma.dtype == input.dtype
            and tuple(gamma.shape) == tuple(input.shape[-1:]),
            f"input {tuple(input.shape)} {input.dtype}, gamma {tuple(gamma.shape)} {gamma.dtype}",
        )


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
    heads = x.reshape(x.shape[0], -1, head_size).clone()
    rot = heads[..., :rotary_dim]
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rot.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rot.copy_(torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2))
    return heads.reshape(x.shape)
