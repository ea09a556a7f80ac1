"""A TEST DOUBLE of ``torch_npu``: its documented operator semantics in PyTorch, on the CPU.

Not the real SDK (which must never be installed here: without CANN it breaks ``import torch``).
It stands in for ``torch_npu`` in ``sys.modules`` with the operators SGLang's ``forward_npu``
methods call, their argument order and return tuples: ``npu_swiglu`` -> ``y``,
``npu_geglu`` -> ``(y, gelu)``, ``npu_gelu`` -> ``y``, ``npu_fast_gelu`` -> ``y``,
``npu_rms_norm`` -> ``(y, rstd)``, ``npu_add_rms_norm`` -> ``(y, rstd, x1 + x2)``,
``npu_layer_norm_eval`` -> ``y``,
``npu_mrope`` -> ``(query, key)`` (plain rope with ``[tokens]`` positions, mrope sections with
``[3, tokens]``), the MoE operators SGLang's NPU MoE path calls
(``npu_moe_gating_top_k_softmax`` -> ``(y, expert_idx, row_idx)``, ``npu_moe_gating_top_k`` ->
``(y, expert_idx, norm_out)``, ``npu_moe_init_routing_v2`` -> ``(expanded_x, expanded_row_idx,
expert_tokens_count, expanded_scale)``, ``npu_grouped_matmul`` -> ``[y]``,
``npu_moe_finalize_routing`` -> ``out``), ``npu.device_count()`` and ``npu.get_soc_version()``,
and the attention operators (``_npu_reshape_and_cache``, ``npu_fused_infer_attention_score``)
of ``torch_npu_attention_double.py``.
It emulates one torch_npu release on one SoC (``TorchNpuDouble(version=, soc_version=)``):
the constraints that differ by release (the MoE gating operator) or SoC (bfloat16 GELUs)
check those of the emulated ones. Every operator returns new
tensors and never writes its inputs. Every precondition the torch_npu API reference documents
for them is a :class:`~sglang_fl.testing.doubles.Constraint` naming that page; a call the real
operator would reject raises :class:`~sglang_fl.testing.doubles.ConstraintViolation`. Each call
is recorded in :attr:`TorchNpuDouble.calls`. Modes the double does not compute (quantized
routing, drop/pad, skips and biases) raise ``NotImplementedError`` rather than a wrong result.
"""

from __future__ import annotations

import re
import types

import torch
import torch.nn.functional as F
from torch_npu_attention_double import AttentionOperators

from sglang_fl.testing.doubles import Constraint

FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# The torch_npu API reference pages (hiascend.com, PyTorch apiref); quoted where the page says
# it in so many words, else the section that states the constraint.
API_DOC = "torch_npu API reference (hiascend.com, PyTorch apiref), {}: {}"
# An input the API reference does not cover (an empty batch): the double refuses it, being
# at least as strict as the real operator, whose behaviour there is not promised.
UNDOCUMENTED = "not covered by the torch_npu API reference of the MoE operators"
# The op-plugin repository's copies of those pages, per branch (github.com/Ascend/op-plugin).
OP_PLUGIN_DOC = "op-plugin {} docs, {}: {}"
# The release the double emulates by default: torch_npu 2.7.1.post2 is an Ascend Extension for
# PyTorch 7.3.0 build (Ascend/pytorch README, version matching table); "+double" marks it.
DOUBLE_RELEASE = "2.7.1.post2+double"
A2_SOC = 220  # torch_npu.npu.get_soc_version() of an Atlas A2 (Ascend910B1)
# SoC versions of Atlas A2 and A3 (vllm-ascend vllm_ascend/utils.py: 220-225, 250-255).
BF16_GELU_SOCS = (*range(220, 226), *range(250, 256))


class TorchNpuDouble(AttentionOperators):
    """``torch_npu`` stand-in with ``devices`` visible NPUs, emulating torch_npu ``version``
    on the SoC ``torch_npu.npu.get_soc_version()`` returns (``soc_version``): the operators
    whose constraints differ by release or SoC check those of the emulated ones."""

    # -- bfloat16 GELUs: npu_geglu / npu_gelu / npu_fast_gelu --------------------------------
    GELU_BF16_SOC = Constraint(
        "npu_geglu/npu_gelu/npu_fast_gelu",
        "bfloat16 input only on Atlas A2/A3 (SoC versions 220-225, 250-255)",
        API_DOC.format(
            "torch_npu.npu_gelu, torch_npu.npu_fast_gelu, torch_npu.npu_geglu",
            "参数说明: Atlas 训练系列产品/Atlas 推理系列产品 数据类型支持float16、float32; "
            "Atlas A2/A3: float16、float32、bfloat16",
        )
        + "; "
        + OP_PLUGIN_DOC.format(
            "master",
            "docs/zh/custom_APIs/torch_npu/torch_npu-npu_gelu.md, -npu_fast_gelu.md",
            "the same per-product dtype lists",
        ),
    )

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

    # -- MoE: how SGLang 0.5.23 calls them is in sglang/srt/hardware_backend/npu/moe/ --------
    MOE_NOT_EMPTY = Constraint(
        "npu_moe_gating_top_k(_softmax)/npu_moe_init_routing_v2/npu_grouped_matmul/"
        "npu_moe_finalize_routing",
        "at least one token",
        UNDOCUMENTED,
        "is undefined",
    )
    # npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (y, expert_idx, row_idx)
    GATING_SOFTMAX_OPERANDS = Constraint(
        "npu_moe_gating_top_k_softmax",
        "2-D or 3-D float16/bfloat16/float32 x, 0 < k <= experts and k <= 1024, a bool "
        "finished when given",
        API_DOC.format(
            "torch_npu.npu_moe_gating_top_k_softmax",
            "k: 大小为0<k<=x的-1轴大小, k<=1024; x, finished parameter description",
        ),
    )
    # npu_moe_gating_top_k(x, k, *, bias, k_group, group_count, group_select_mode, renorm,
    #                      norm_type, out_flag, routed_scaling_factor, eps) -> (y, idx, out)
    GATING_X = Constraint(
        "npu_moe_gating_top_k",
        "2-D float16/bfloat16/float32 x [tokens, experts] with at most 2048 experts",
        API_DOC.format("torch_npu.npu_moe_gating_top_k", "parameter description of x"),
    )
    GATING_GROUPS = Constraint(
        "npu_moe_gating_top_k",
        "group_count dividing the experts into groups of more than 2, align32(experts / "
        "group_count) * group_count <= 2048, 1 <= k_group <= group_count and "
        "1 <= k <= experts / group_count * k_group",
        OP_PLUGIN_DOC.format(
            "7.2.0 (and 7.3.0, 26.0.0, master)",
            "docs/context/torch_npu-npu_moe_gating_top_k.md",
            "group_count: x_shape[-1]能够被group_count整除且整除后的结果大于2, 并且整除的结果按照"
            "32个数对齐后乘group_count的结果不大于2048; k_group, k parameter description",
        ),
    )
    GATING_RESTRICTED = Constraint(
        "npu_moe_gating_top_k",
        "on torch_npu before 2.7.1 (Ascend Extension for PyTorch 7.0.0/7.1.0 builds): exactly "
        "256 experts, 1 <= k <= 32, a bias, k_group 4, group_count 8, norm_type 1 (sigmoid) "
        "and group_select_mode 1",
        OP_PLUGIN_DOC.format(
            "7.1.0",
            "docs/context/torch_npu-npu_moe_gating_top_k.md",
            "x最后一维的大小(即专家数)当前只支持取256; k取值范围为[1, 32]; bias 必须不为None; "
            "k_group当前只支持取4; group_count当前只支持取8",
        )
        + "; "
        + API_DOC.format(
            "PyTorch 7.0.0 torch_npu.npu_moe_gating_top_k (ptaoplist_002365)",
            "the same limits, and a sigmoid, top-2-sum grouping operator",
        ),
    )
    GATING_BIAS = Constraint(
        "npu_moe_gating_top_k",
        "a bias [experts] in x's dtype when one is given",
        API_DOC.format("torch_npu.npu_moe_gating_top_k", "parameter description of bias"),
    )
    GATING_MODES = Constraint(
        "npu_moe_gating_top_k",
        "group_select_mode 0 (group max) or 1 (sum of the best two), norm_type 0 (softmax) or "
        "1 (sigmoid), renorm 0 (normalise, then choose)",
        API_DOC.format(
            "torch_npu.npu_moe_gating_top_k",
            "parameter description of group_select_mode, norm_type, renorm (only 0 supported)",
        ),
    )
    # npu_moe_init_routing_v2(x, expert_idx, *, scale, offset, active_num, expert_capacity,
    #     expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode,
    #     active_expert_range, row_idx_type) -> (expanded_x, expanded_row_idx, counts, scale)
    INIT_ROUTING_QUANT_MODE = Constraint(
        "npu_moe_init_routing_v2",
        "quant_mode passed explicitly (-1: unquantized)",
        API_DOC.format(
            "torch_npu.npu_moe_init_routing_v2 (PyTorch 7.0.0)",
            "the prototype's default is quant_mode=0 (static quantization), other torch_npu "
            "branches default to -1 (op-plugin MoeInitRoutingV2KernelNpuOpApi.cpp: "
            "QUANT_MODE_UNQUANT = -1, QUANT_MODE_STATIC = 0)",
        ),
        "quantizes the activations on the branches whose default is 0",
    )
    INIT_ROUTING_X = Constraint(
        "npu_moe_init_routing_v2",
        "2-D x [NUM_ROWS, H] in float16/bfloat16/float32",
        API_DOC.format(
            "torch_npu.npu_moe_init_routing_v2",
            "x 要求为2D的Tensor; 数据类型支持float16、bfloat16、float32",
        ),
    )
    INIT_ROUTING_EXPERT_IDX = Constraint(
        "npu_moe_init_routing_v2",
        "2-D int32 expert_idx [NUM_ROWS, K] with ids below expert_num, active_num = NUM_ROWS * K",
        API_DOC.format(
            "torch_npu.npu_moe_init_routing_v2",
            "expert_idx 要求是2D的Tensor, shape为(NUM_ROWS, K), 且专家id不能超过专家数; "
            "数据类型支持int32",
        ),
    )
    # npu_grouped_matmul(x, weight, *, bias, group_list, split_item, group_type,
    #                    group_list_type, output_dtype) -> [y]
    GROUPED_MATMUL_OPERANDS = Constraint(
        "npu_grouped_matmul",
        "x [[M, K]] and weight [[g, K, N]] in one float16/bfloat16/float32 dtype, output_dtype "
        "that dtype",
        API_DOC.format("torch_npu.npu_grouped_matmul", "parameter description of x, weight"),
    )
    GROUPED_MATMUL_GROUP_LIST = Constraint(
        "npu_grouped_matmul",
        "a 1-D int64 group_list of g entries covering the M rows: cumulative row counts "
        "(group_list_type 0, non-decreasing, ending at M) or per-group counts (group_list_type "
        "1, summing to M, not of length 1)",
        OP_PLUGIN_DOC.format(
            "master",
            "docs/zh/custom_APIs/torch_npu/torch_npu-npu_grouped_matmul.md",
            "group_list: 当group_list_type为0时, group_list必须为非负、单调非递减数列; 当"
            "group_list_type为1时, group_list必须为非负数列, 且长度不能为1",
        ),
    )
    # npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales,
    #     expanded_src_to_dst_row, export_for_source_row, drop_pad_mode) -> out
    FINALIZE_OPERANDS = Constraint(
        "npu_moe_finalize_routing",
        "scales [NUM_ROWS, K] in the rows' dtype, int32 export_for_source_row of scales' shape, "
        "int32 expanded_src_to_dst_row [NUM_ROWS * K]",
        API_DOC.format(
            "torch_npu.npu_moe_finalize_routing",
            "parameter description of scales, expanded_src_to_dst_row, export_for_source_row",
        ),
    )

    # -- npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-5) ------
    LAYER_NORM_OPERANDS = Constraint(
        "npu_layer_norm_eval",
        "float32/float16/bfloat16 input whose last dims are normalized_shape, and weight/bias "
        "(when given) of that shape in the input's dtype",
        API_DOC.format(
            "(beta)torch_npu.npu_layer_norm_eval",
            "normalized_shape 须与input最后若干维逐维一致; "
            "weight/bias shape须与normalized_shape一致",
        )
        + "; op-plugin op_plugin/ops/aclops/LayerNormEvalKernelNpu.cpp: default weight and bias "
        "made with input.options(), mean/rstd in the weight's dtype",
    )

    def __init__(
        self, devices: int = 1, *, version: str = DOUBLE_RELEASE, soc_version: int = A2_SOC
    ) -> None:
        super().__init__("torch_npu")
        self.__version__ = version
        match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
        self.release = tuple(int(n) for n in match.groups()) if match else (0, 0, 0)
        self.soc_version = soc_version
        self.npu = types.SimpleNamespace(
            device_count=lambda: devices, get_soc_version=lambda: self.soc_version
        )

    def _check_bf16_gelu(self, input: torch.Tensor) -> None:
        self.GELU_BF16_SOC.check(
            input.dtype != torch.bfloat16 or self.soc_version in BF16_GELU_SOCS,
            f"bfloat16 on SoC {self.soc_version}",
        )

    def npu_layer_norm_eval(
        self,
        input: torch.Tensor,
        normalized_shape: list[int],
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float = 1e-5,
    ) -> torch.Tensor:
        """``F.layer_norm`` semantics (the page's formula), computed in float32 and rounded."""
        self.record(
            "npu_layer_norm_eval", input, normalized_shape, weight=weight, bias=bias, eps=eps
        )
        shape = tuple(normalized_shape)
        self.LAYER_NORM_OPERANDS.check(
            input.dtype in FLOATS
            and tuple(input.shape[len(input.shape) - len(shape) :]) == shape
            and all(
                t is None or (tuple(t.shape) == shape and t.dtype == input.dtype)
                for t in (weight, bias)
            ),
            f"input {tuple(input.shape)} {input.dtype}, normalized_shape {list(shape)}, "
            + ", ".join(
                f"{n} {tuple(t.shape)} {t.dtype}"
                for n, t in (("weight", weight), ("bias", bias))
                if t is not None
            ),
        )
        out = F.layer_norm(
            input.float(),
            shape,
            None if weight is None else weight.float(),
            None if bias is None else bias.float(),
            eps,
        )
        return out.to(input.dtype)

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
        self._check_bf16_gelu(input)
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
        self._check_bf16_gelu(input)
        return F.gelu(input.float(), approximate=approximate).to(input.dtype)

    def npu_fast_gelu(self, input: torch.Tensor) -> torch.Tensor:
        """``x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|))``, its documented formula."""
        self.record("npu_fast_gelu", input)
        self.FAST_GELU_OPERANDS.check(input.dtype in FLOATS, f"{input.dtype}")
        self._check_bf16_gelu(input)
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
        cache_mode: str | None = None,  # None: not passed (the 26.0.0+ default is 'default')
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
            **({} if cache_mode is None else {"cache_mode": cache_mode}),
        )
        # cache_mode (26.0.0+ schema: str? cache_mode='default'): only the default cache layout
        # is modelled; older releases have no such argument, so adapters do not pass it.
        _unmodeled(cache_mode in (None, "default"), f"npu_mrope cache_mode {cache_mode!r}")
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

    def npu_moe_gating_top_k_softmax(
        self, x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Top-k of softmax(x): ``y`` in x's dtype, int32 ids, int32 ``row_idx``."""
        self.record("npu_moe_gating_top_k_softmax", x, finished=finished, k=k)
        self.GATING_SOFTMAX_OPERANDS.check(
            x.dim() in (2, 3)
            and x.dtype in FLOATS
            and 0 < k <= min(x.shape[-1], 1024)
            and (finished is None or finished.dtype == torch.bool),
            f"x {x.dtype} {tuple(x.shape)}, k {k}",
        )
        self.MOE_NOT_EMPTY.check(x.numel() > 0, f"x {tuple(x.shape)}")
        _unmodeled(finished is None, "a finished mask")
        y, ids = torch.topk(x.float().softmax(dim=-1), k, dim=-1)
        rows = torch.arange(ids.numel(), dtype=torch.int32).view(k, -1).t().reshape(ids.shape)
        return y.to(x.dtype), ids.to(torch.int32), rows

    def npu_moe_gating_top_k(
        self,
        x: torch.Tensor,
        k: int,
        *,
        bias: torch.Tensor | None = None,
        k_group: int = 1,
        group_count: int = 1,
        group_select_mode: int = 0,
        renorm: int = 0,
        norm_type: int = 0,
        out_flag: bool = False,
        routed_scaling_factor: float = 1.0,
        eps: float = 1e-20,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """aclnnMoeGatingTopK: norm, + bias for the choice, groups, top-k, (sigmoid: divided by
        sum + eps), times routed_scaling_factor; and normOut."""
        self.record(
            "npu_moe_gating_top_k",
            x,
            k,
            bias=bias,
            k_group=k_group,
            group_count=group_count,
            group_select_mode=group_select_mode,
            renorm=renorm,
            norm_type=norm_type,
            out_flag=out_flag,
            routed_scaling_factor=routed_scaling_factor,
            eps=eps,
        )
        self.GATING_X.check(
            x.dim() == 2 and x.dtype in FLOATS and x.shape[-1] <= 2048,
            f"x {x.dtype} {tuple(x.shape)}",
        )
        tokens, experts = x.shape
        per_group = experts // group_count if group_count >= 1 else 0
        self.GATING_GROUPS.check(
            group_count >= 1
            and experts % group_count == 0
            and per_group > 2
            and -(-per_group // 32) * 32 * group_count <= 2048
            and 1 <= k_group <= group_count
            and 1 <= k <= per_group * k_group,
            f"{experts} experts, group_count {group_count}, k_group {k_group}, k {k}",
        )
        self.GATING_RESTRICTED.check(
            self.release >= (2, 7, 1)
            or (
                experts == 256
                and 1 <= k <= 32
                and bias is not None
                and (k_group, group_count, norm_type, group_select_mode) == (4, 8, 1, 1)
            ),
            f"torch_npu {self.__version__}: {experts} experts, k {k}, k_group {k_group}, "
            f"group_count {group_count}, norm_type {norm_type}, group_select_mode "
            f"{group_select_mode}, {'a' if bias is not None else 'no'} bias",
        )
        self.GATING_BIAS.check(
            bias is None or (tuple(bias.shape) == (experts,) and bias.dtype == x.dtype),
            "" if bias is None else f"bias {bias.dtype} {tuple(bias.shape)}",
        )
        self.GATING_MODES.check(
            group_select_mode in (0, 1) and norm_type in (0, 1) and renorm == 0,
            f"group_select_mode {group_select_mode}, norm_type {norm_type}, renorm {renorm}",
        )
        self.MOE_NOT_EMPTY.check(tokens > 0, f"x {tuple(x.shape)}")
        _unmodeled(not out_flag, "out_flag=True (the normalised scores as a third output)")
        scores = x.float().softmax(dim=-1) if norm_type == 0 else x.float().sigmoid()
        choice = scores if bias is None else scores + bias.float()
        if group_count > 1:
            grouped = choice.view(tokens, group_count, -1)
            group_score = (
                grouped.max(dim=-1).values
                if group_select_mode == 0
                else grouped.topk(2, dim=-1).values.sum(dim=-1)
            )
            chosen = torch.topk(group_score, k_group, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, chosen, True)
            choice = choice.masked_fill(~keep.repeat_interleave(experts // group_count, 1), -1e30)
        ids = torch.topk(choice, k, dim=-1).indices
        y = scores.gather(1, ids)
        # The page's equivalent code (op-plugin master torch_npu-npu_moe_gating_top_k.md,
        # 等价计算逻辑) divides by the sum for sigmoid (norm_type 1) only; its formula says always.
        # The double takes the reading that asks more of a caller: softmax weights undivided.
        if norm_type == 1:
            y = y / (y.sum(dim=-1, keepdim=True) + eps)
        y = y * routed_scaling_factor
        # normOut is always allocated (op-plugin MoeGatingTopKKernelNpuOpApi.cpp: float32
        # [rows, experts]); with out_flag=False it is never written: NaN here, not a value.
        norm_out = torch.full((tokens, experts), float("nan"), dtype=torch.float32)
        return y.to(x.dtype), ids.to(torch.int32), norm_out

    def npu_moe_init_routing_v2(
        self,
        x: torch.Tensor,
        expert_idx: torch.Tensor,
        *,
        scale: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
        active_num: int = -1,
        expert_capacity: int = -1,
        expert_num: int = -1,
        drop_pad_mode: int = 0,
        expert_tokens_num_type: int = 0,
        expert_tokens_num_flag: bool = False,
        quant_mode: int | None = None,  # None: not passed (the default differs by branch)
        active_expert_range: list[int] | None = None,
        row_idx_type: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rows of ``x`` sorted by expert (stable), where each source row (token-major flat
        index ``t * k + j``) went, and per-expert counts."""
        self.record(
            "npu_moe_init_routing_v2",
            x,
            expert_idx,
            active_num=active_num,
            expert_num=expert_num,
            expert_tokens_num_type=expert_tokens_num_type,
            expert_tokens_num_flag=expert_tokens_num_flag,
            active_expert_range=active_expert_range,
            quant_mode=quant_mode,
        )
        self.INIT_ROUTING_QUANT_MODE.check(quant_mode is not None, "no quant_mode")
        self.INIT_ROUTING_X.check(
            x.dim() == 2 and x.dtype in FLOATS, f"x {x.dtype} {tuple(x.shape)}"
        )
        flat = expert_idx.reshape(-1).long()
        self.INIT_ROUTING_EXPERT_IDX.check(
            expert_idx.dim() == 2
            and expert_idx.dtype == torch.int32
            and expert_idx.shape[0] == x.shape[0]
            and active_num == expert_idx.numel()
            and bool(((flat >= 0) & (flat < expert_num)).all()),
            f"expert_idx {expert_idx.dtype} {tuple(expert_idx.shape)}, x rows {x.shape[0]}, "
            f"active_num {active_num}, expert_num {expert_num}",
        )
        self.MOE_NOT_EMPTY.check(x.shape[0] > 0, f"x {tuple(x.shape)}")
        _unmodeled(
            quant_mode == -1 and scale is None and offset is None,
            f"quant_mode {quant_mode} (quantized routing) or a scale/offset",
        )
        _unmodeled(
            drop_pad_mode == 0
            and expert_capacity == -1
            and row_idx_type == 0
            and active_expert_range == [0, expert_num]
            and expert_tokens_num_type in (0, 1)
            and expert_tokens_num_flag,
            "drop/pad, scatter indices, expert ranges or [E, 2] key-value counts",
        )
        order = torch.sort(flat, stable=True).indices
        destination = torch.empty_like(order)
        destination[order] = torch.arange(order.numel())
        sorted_x = x[order // expert_idx.shape[1]]
        counts = torch.bincount(flat, minlength=expert_num).to(torch.int64)
        if expert_tokens_num_type == 0:  # cumsum: the end row of each expert
            counts = counts.cumsum(0)
        return sorted_x, destination.to(torch.int32), counts, None

    def npu_grouped_matmul(
        self,
        x: list[torch.Tensor],
        weight: list[torch.Tensor],
        *,
        bias: list[torch.Tensor] | None = None,
        group_list: torch.Tensor | None = None,
        split_item: int = 0,
        group_type: int = -1,
        group_list_type: int = 0,
        output_dtype: torch.dtype | None = None,
    ) -> list[torch.Tensor]:
        """One matmul per group of rows: rows of group g times ``weight[0][g]`` ``[in, out]``."""
        self.record(
            "npu_grouped_matmul",
            x,
            weight,
            split_item=split_item,
            group_list_type=group_list_type,
            group_type=group_type,
            group_list=group_list,
            output_dtype=output_dtype,
        )
        _unmodeled(
            len(x) == 1
            and len(weight) == 1
            and bias is None
            and split_item in (2, 3)
            and group_type == 0
            and group_list_type in (0, 1),
            "several x/weight tensors, biases, or [E, 2] group lists",
        )
        rows, weights = x[0], weight[0]
        self.GROUPED_MATMUL_OPERANDS.check(
            rows.dim() == 2
            and weights.dim() == 3
            and weights.shape[1] == rows.shape[1]
            and rows.dtype in FLOATS
            and weights.dtype == rows.dtype
            and output_dtype == rows.dtype,
            f"x {rows.dtype} {tuple(rows.shape)}, weight {weights.dtype} "
            f"{tuple(weights.shape)}, output_dtype {output_dtype}",
        )
        given = torch.empty(0, dtype=torch.int64) if group_list is None else group_list
        if group_list_type == 0:  # cumulative: back to per-group counts
            counts = torch.diff(given, prepend=given.new_zeros(1)) if given.numel() else given
            covers = given.numel() > 0 and int(given[-1]) == rows.shape[0]
            form_ok = bool((counts >= 0).all())
        else:
            counts = given
            covers = int(given.sum()) == rows.shape[0]
            form_ok = given.numel() != 1 and bool((given >= 0).all())
        self.GROUPED_MATMUL_GROUP_LIST.check(
            given.dtype == torch.int64
            and tuple(given.shape) == (weights.shape[0],)
            and covers
            and form_ok,
            f"group_list {given.tolist() if given.numel() < 9 else tuple(given.shape)} "
            f"{given.dtype} (group_list_type {group_list_type}), {rows.shape[0]} rows",
        )
        self.MOE_NOT_EMPTY.check(rows.shape[0] > 0, f"x {tuple(rows.shape)}")
        outputs = [
            (part.float() @ weights[g].float()).to(rows.dtype)  # output_dtype, checked above
            for g, part in enumerate(rows.split(counts.tolist()))
        ]
        return [torch.cat(outputs)]

    def npu_moe_finalize_routing(
        self,
        expanded_permuted_rows: torch.Tensor,
        skip1: torch.Tensor | None,
        skip2: torch.Tensor | None,
        bias: torch.Tensor | None,
        scales: torch.Tensor,
        expanded_src_to_dst_row: torch.Tensor,
        export_for_source_row: torch.Tensor,
        drop_pad_mode: int = 0,
    ) -> torch.Tensor:
        """``out[t] = sum_j scales[t, j] * rows[expanded_src_to_dst_row[t * k + j]]``."""
        self.record(
            "npu_moe_finalize_routing",
            expanded_permuted_rows,
            skip1,
            skip2,
            bias,
            scales,
            expanded_src_to_dst_row,
            export_for_source_row,
            drop_pad_mode=drop_pad_mode,
        )
        self.FINALIZE_OPERANDS.check(
            scales.dim() == 2
            and scales.dtype == expanded_permuted_rows.dtype
            and export_for_source_row.shape == scales.shape
            and export_for_source_row.dtype == torch.int32
            and expanded_src_to_dst_row.dtype == torch.int32
            and tuple(expanded_src_to_dst_row.shape) == (scales.numel(),),
            f"scales {scales.dtype} {tuple(scales.shape)}, rows {expanded_permuted_rows.dtype}, "
            f"export_for_source_row {export_for_source_row.dtype} "
            f"{tuple(export_for_source_row.shape)}, expanded_src_to_dst_row "
            f"{expanded_src_to_dst_row.dtype} {tuple(expanded_src_to_dst_row.shape)}",
        )
        self.MOE_NOT_EMPTY.check(scales.shape[0] > 0, f"scales {tuple(scales.shape)}")
        _unmodeled(
            skip1 is None and skip2 is None and bias is None and drop_pad_mode == 0,
            "skips, an expert bias or drop/pad",
        )
        tokens, k = scales.shape
        rows = expanded_permuted_rows[expanded_src_to_dst_row.long()].view(tokens, k, -1)
        out = (rows.float() * scales.float().unsqueeze(-1)).sum(dim=1)
        return out.to(expanded_permuted_rows.dtype)

    def _check_norm(self, input: torch.Tensor, gamma: torch.Tensor) -> None:
        self.RMS_NORM_OPERANDS.check(
            input.dtype in FLOATS
            and gamma.dtype == input.dtype
            and tuple(gamma.shape) == tuple(input.shape[-1:]),
            f"input {tuple(input.shape)} {input.dtype}, gamma {tuple(gamma.shape)} {gamma.dtype}",
        )


def _unmodeled(holds: bool, what: str) -> None:
    """Refuse a call the double does not compute (the real operator may accept it)."""
    if not holds:
        raise NotImplementedError(f"the test double does not model {what}")


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
