"""A TEST DOUBLE of ``torch_npu``'s quantization operators, on the CPU (never the real SDK).

:class:`TorchNpuQuantDouble` extends the ``torch_npu`` double with ``npu_dynamic_quant``,
``npu_quant_matmul``, ``npu_weight_quant_batchmatmul`` and ``npu_convert_weight_to_int4pack``:
their argument order and results as the torch_npu API reference documents them (the op-plugin
repository's ``docs/context/torch_npu-<operator>.md``), each documented precondition a
:class:`~sglang_fl.testing.doubles.Constraint` citing the page, checked for an Atlas A2/A3. The
int4 packing is the double's own (the real one interleaves, a layout only its matmuls read), so
only the double's matmul unpacks what the double's ``npu_convert_weight_to_int4pack`` packed.
"""

from __future__ import annotations

import torch
from torch_npu_double import TorchNpuDouble

from sglang_fl.testing.doubles import Constraint

DOCS = "op-plugin docs/context/torch_npu-{}.md: {}"
HALF = (torch.float16, torch.bfloat16)


class TorchNpuQuantDouble(TorchNpuDouble):
    """``torch_npu`` stand-in with the quantized matmuls SGLang's NPU linear methods call."""

    DYNAMIC_QUANT_INPUT = Constraint(
        "npu_dynamic_quant",
        "float16 or bfloat16 x of more than one dimension",
        DOCS.format("npu_dynamic_quant", "x ... 数据类型支持float16、bfloat16 ... 维度必须大于1"),
    )
    QUANT_MATMUL_OPERANDS = Constraint(
        "npu_quant_matmul",
        "int8 x1 [m, k] and x2 [k, n], not empty, last dims at most 65535",
        DOCS.format(
            "npu_quant_matmul",
            "x1/x2 int8 ... 传入的x1、x2、scale不能是空 ... 最后一维的shape大小不能超过65535",
        ),
    )
    QUANT_MATMUL_DTYPES = Constraint(
        "npu_quant_matmul",
        "with a float32 pertoken_scale [m]: float32 scale [n] and float16 output, or "
        "float32/bfloat16 scale and bfloat16 output; bias int32/bfloat16/float32 [n]",
        DOCS.format("npu_quant_matmul", "表 2 (Atlas A2/A3) rows with pertoken_scale float32"),
    )
    WEIGHT_QUANT_INPUT = Constraint(
        "npu_weight_quant_batchmatmul",
        "float16/bfloat16 x [M, K], int8 weight [K, N] or int32 (int4 pack) [K, N / 8], not "
        "empty, K and N in [1, 65535]",
        DOCS.format(
            "npu_weight_quant_batchmatmul",
            "x float16、bfloat16 ... weight int8、int32 ... 不支持空Tensor输入 ... "
            "K、N的范围为[1, 65535]",
        ),
    )
    WEIGHT_QUANT_SCALES = Constraint(
        "npu_weight_quant_batchmatmul",
        "antiquant_scale in x's dtype, [N] / [1, N] per channel or [ceil(K / group), N] per group "
        "with a group of a multiple of 32 in [32, K - 1]; antiquant_offset of the scale's shape "
        "and dtype",
        DOCS.format(
            "npu_weight_quant_batchmatmul",
            "antiquant_scale ... 其数据类型需与x保持一致 ... per_group模式 (ceil(K, group), N) ... "
            "antiquant_group_size [32, K-1]且必须是32的倍数; "
            "antiquant_scale和antiquant_offset的输入"
            "shape要保持一致",
        ),
    )
    WEIGHT_QUANT_BIAS = Constraint(
        "npu_weight_quant_batchmatmul",
        "a contiguous bias [N]: float32 with bfloat16 x, float16 with float16 x",
        DOCS.format(
            "npu_weight_quant_batchmatmul", "bias ... 当x数据类型为bfloat16，bias需为float32"
        ),
    )
    INT4PACK = Constraint(
        "npu_convert_weight_to_int4pack",
        "a contiguous 2-D int32 weight of values in [-8, 7], the last dim a multiple of 8",
        DOCS.format(
            "npu_convert_weight_to_int4pack",
            "数据类型支持int32，要求weight中元素取值在int4的表示范围内 ... "
            "最后一维度需要8个元素对齐 ... "
            "不支持非连续的Tensor",
        ),
    )

    def npu_dynamic_quant(self, x, *, smooth_scales=None, group_index=None, dst_type=None):  # type: ignore[no-untyped-def]
        self.record("npu_dynamic_quant", x, smooth_scales=smooth_scales, dst_type=dst_type)
        self.DYNAMIC_QUANT_INPUT.check(
            x.dtype in HALF and x.dim() > 1, f"{x.dtype} {tuple(x.shape)}"
        )
        assert smooth_scales is None, "not modelled"
        assert group_index is None, "not modelled"
        assert dst_type is None, "not modelled"
        values = x.float()
        scale = values.abs().amax(dim=-1) / 127.0  # rowMax(|x|) / DTYPE_MAX
        q = torch.round(values / scale.clamp(min=1e-10).unsqueeze(-1)).clamp(-127, 127)
        return q.to(torch.int8), scale

    def npu_quant_matmul(  # type: ignore[no-untyped-def]
        self, x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
        group_sizes=None,
    ):  # fmt: skip
        self.record("npu_quant_matmul", x1, x2, scale, pertoken_scale=pertoken_scale,
                    bias=bias, output_dtype=output_dtype)  # fmt: skip
        self.QUANT_MATMUL_OPERANDS.check(
            x1.dtype == torch.int8 and x2.dtype == torch.int8 and x1.dim() == 2 and x2.dim() == 2
            and x1.shape[1] == x2.shape[0] and x1.numel() > 0 and x2.numel() > 0
            and x1.shape[1] <= 65535 and x2.shape[1] <= 65535,
            f"x1 {x1.dtype} {tuple(x1.shape)}, x2 {x2.dtype} {tuple(x2.shape)}",
        )  # fmt: skip
        m, n = x1.shape[0], x2.shape[1]
        scale_ok = scale.dim() == 1 and scale.shape[0] in (1, n)
        row_f16 = output_dtype == torch.float16 and scale.dtype == torch.float32
        row_bf16 = output_dtype == torch.bfloat16 and scale.dtype in (torch.float32, torch.bfloat16)
        self.QUANT_MATMUL_DTYPES.check(
            scale_ok and pertoken_scale is not None and pertoken_scale.dtype == torch.float32
            and tuple(pertoken_scale.shape) == (m,) and (row_f16 or row_bf16) and offset is None
            and (bias is None or (bias.dtype in (torch.int32, torch.bfloat16, torch.float32)
                                  and tuple(bias.shape) == (n,))),
            f"scale {scale.dtype} {tuple(scale.shape)}, pertoken "
            f"{None if pertoken_scale is None else pertoken_scale.dtype} "
            f"{None if pertoken_scale is None else tuple(pertoken_scale.shape)}"
            f", bias {None if bias is None else bias.dtype}, output {output_dtype}",
        )  # fmt: skip
        acc = torch._int_mm(x1, x2.contiguous()).float()
        out = acc * scale.float() * pertoken_scale.unsqueeze(-1)
        if bias is not None:
            out = out + bias.float()
        return out.to(output_dtype)

    def npu_convert_weight_to_int4pack(self, weight, inner_k_tiles=0):  # type: ignore[no-untyped-def]
        self.record("npu_convert_weight_to_int4pack", weight)
        self.INT4PACK.check(
            weight.dtype == torch.int32 and weight.dim() == 2 and weight.is_contiguous()
            and weight.shape[-1] % 8 == 0 and bool(((weight >= -8) & (weight <= 7)).all()),
            f"{weight.dtype} {tuple(weight.shape)}",
        )  # fmt: skip
        nibbles = (weight & 0xF).to(torch.int64).reshape(weight.shape[0], -1, 8)
        packed = sum(nibbles[..., i] << (4 * i) for i in range(8))
        return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)

    def npu_weight_quant_batchmatmul(  # type: ignore[no-untyped-def]
        self, x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
        quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
    ):  # fmt: skip
        self.record("npu_weight_quant_batchmatmul", x, weight, antiquant_scale, antiquant_offset,
                    bias=bias, antiquant_group_size=antiquant_group_size)  # fmt: skip
        packed = weight.dtype == torch.int32
        k = weight.shape[0]
        n = weight.shape[1] * (8 if packed else 1)
        self.WEIGHT_QUANT_INPUT.check(
            x.dtype in HALF and x.dim() == 2 and x.shape[1] == k and x.numel() > 0
            and weight.dtype in (torch.int8, torch.int32) and 1 <= k <= 65535 and 1 <= n <= 65535,
            f"x {x.dtype} {tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}",
        )  # fmt: skip
        group = antiquant_group_size
        if group:
            shape_ok = tuple(antiquant_scale.shape) == (-(-k // group), n)
            group_ok = group % 32 == 0 and 32 <= group <= k - 1
        else:
            shape_ok = tuple(antiquant_scale.shape) in ((n,), (1, n))
            group_ok = True
        self.WEIGHT_QUANT_SCALES.check(
            shape_ok and group_ok and antiquant_scale.dtype == x.dtype
            and (antiquant_offset is None or (antiquant_offset.shape == antiquant_scale.shape
                                              and antiquant_offset.dtype == antiquant_scale.dtype)),
            f"scale {antiquant_scale.dtype} {tuple(antiquant_scale.shape)}, group {group}",
        )  # fmt: skip
        if bias is not None:
            want = torch.float32 if x.dtype == torch.bfloat16 else torch.float16
            self.WEIGHT_QUANT_BIAS.check(
                bias.dtype == want and bias.is_contiguous() and bias.numel() == n, str(bias.dtype)
            )
        assert quant_scale is None, "not modelled"
        assert quant_offset is None, "not modelled"
        values = weight.float()
        if packed:
            words = weight.to(torch.int64) & 0xFFFFFFFF
            nibbles = torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=-1)
            values = torch.where(nibbles >= 8, nibbles - 16, nibbles).reshape(k, n).float()
        rows = group if group else k
        scale = antiquant_scale.reshape(-1, n).repeat_interleave(rows, dim=0)[:k]
        if antiquant_offset is not None:
            values = values + antiquant_offset.reshape(-1, n).repeat_interleave(rows, 0)[:k].float()
        # ANTIQUANT(weight) = (weight + offset) * scale, in the scale's dtype, then x @ it
        dense = (values.to(x.dtype) * scale).to(x.dtype)
        out = torch.nn.functional.linear(x, dense.t())
        return out if bias is None else (out.float() + bias.float()).to(x.dtype)
