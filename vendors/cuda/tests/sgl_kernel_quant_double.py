"""A TEST DOUBLE of ``sgl_kernel``'s quantized GEMMs and ``awq_dequantize``, on the CPU.

Not the real SDK: :class:`SglKernelQuantDouble` extends the ``sgl_kernel`` double with the
kernels SGLang's quantization methods call on an NVIDIA GPU, same names, argument order and
return values as ``sgl-kernel/python/sgl_kernel/gemm.py`` (sglang-kernel 0.4.x), each refusing
what the real kernel refuses (:class:`~sglang_fl.testing.doubles.Constraint`, citing the
``TORCH_CHECK`` of ``sgl-kernel/csrc/gemm/*.cu``). The arithmetic is the kernels' epilogue:
the integer or fp8 product accumulated in float32, times the scales, plus the bias, rounded once
to ``out_dtype``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sgl_kernel_double import SglangTritonMoeDouble, SglKernelDouble

from sglang_fl.testing.doubles import Constraint

GEMM = "sgl-kernel/csrc/gemm"
INT8_GEMM = f"{GEMM}/int8_gemm_kernel.cu, int8_scaled_mm's TORCH_CHECKs"
FP8_GEMM = f"{GEMM}/fp8_gemm_kernel.cu, fp8_scaled_mm's TORCH_CHECKs"
BLOCK_GEMM = f"{GEMM}/fp8_blockwise_gemm_kernel.cu, fp8_blockwise_scaled_mm's TORCH_CHECKs"
AWQ = f"{GEMM}/awq_kernel.cu, awq_dequantize"
SCALED_MMS = "int8_scaled_mm/fp8_scaled_mm/fp8_blockwise_scaled_mm"
HALF = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn


class SglKernelQuantDouble(SglKernelDouble):
    """``sgl_kernel`` stand-in with the quantized GEMMs and ``awq_dequantize``."""

    MM_LAYOUT = Constraint(
        SCALED_MMS,
        "2-D mat_a row-major [M, K] and mat_b column-major [K, N] (stride(0) == 1)",
        f"{INT8_GEMM}: 'mat_a must be a row major tensor', 'mat_b must be a column major tensor'",
    )
    MM_OUT_DTYPE = Constraint(
        SCALED_MMS,
        "out_dtype float16 or bfloat16",
        f"{INT8_GEMM}: 'out_dtype must be Half or BFloat16'",
    )
    INT8_ALIGN = Constraint(
        "int8_scaled_mm",
        "int8 operands, K % 16 == 0 and N % 8 == 0",
        f"{INT8_GEMM}: 'mat_a.size(1) must be multiple of 16', "
        "'mat_b.size(1) must be multiple of 8'",
    )
    MM_SCALES = Constraint(
        "int8_scaled_mm/fp8_scaled_mm",
        "contiguous float32 scales_a of M values and scales_b of N values",
        f"{INT8_GEMM} and {FP8_GEMM}: 'size of scales_a is not matched', 'scales_a must be "
        "Float32', 'scales_a must be contiguous'",
    )
    MM_BIAS = Constraint(
        "int8_scaled_mm/fp8_scaled_mm",
        "a contiguous bias of N values in out_dtype, when given",
        f"{INT8_GEMM}: 'bias dtype must match output dtype', 'bias must be contiguous'",
    )
    FP8_ALIGN = Constraint(
        "fp8_scaled_mm/fp8_blockwise_scaled_mm",
        "float8_e4m3fn operands with K a multiple of 16 bytes, and output rows of 16 bytes",
        f"{FP8_GEMM}: 'mat_a must be multiple of 16 bytes', 'out must be multiple of 16 bytes'",
    )
    BLOCK_SCALES = Constraint(
        "fp8_blockwise_scaled_mm",
        "float32 scales_a [M, K/128] M-major and scales_b [K/128, N/128] K-major",
        f"{BLOCK_GEMM}: 'size of scales_a is not matched', 'scales_a must be M major', "
        "'scales_b must be K major'",
    )
    AWQ_HALF = Constraint(
        "awq_dequantize",
        "contiguous int32 qweight/qzeros and float16 scales",
        f"{AWQ}: scales.data_ptr<at::Half>(), qweight.data_ptr<int>()",
        "reads the scales' bytes as float16",
    )
    AWQ_GRID = Constraint(
        "awq_dequantize",
        "qweight with rows and columns multiples of 16",
        f"{AWQ}: a grid of qweight_cols / 16 x qweight_rows / 16 blocks of 16x16 threads",
        "leaves the output's remainder unwritten",
    )

    def int8_scaled_mm(self, mat_a, mat_b, scales_a, scales_b, out_dtype, bias=None):  # type: ignore[no-untyped-def]
        self.record("int8_scaled_mm", mat_a, mat_b, scales_a, scales_b, out_dtype, bias)
        self._check_mm(mat_a, mat_b, out_dtype)
        self.INT8_ALIGN.check(
            mat_a.dtype == torch.int8 and mat_b.dtype == torch.int8
            and mat_a.shape[1] % 16 == 0 and mat_b.shape[1] % 8 == 0,
            f"{mat_a.dtype} {tuple(mat_a.shape)} x {mat_b.dtype} {tuple(mat_b.shape)}",
        )  # fmt: skip
        self._check_vector_scales(mat_a, mat_b, scales_a, scales_b, bias, out_dtype)
        acc = torch._int_mm(mat_a, mat_b).to(torch.float32)
        return self._epilogue(acc, scales_a, scales_b, bias, out_dtype)

    def fp8_scaled_mm(self, mat_a, mat_b, scales_a, scales_b, out_dtype, bias=None):  # type: ignore[no-untyped-def]
        self.record("fp8_scaled_mm", mat_a, mat_b, scales_a, scales_b, out_dtype, bias)
        self._check_mm(mat_a, mat_b, out_dtype)
        self._check_fp8(mat_a, mat_b, out_dtype)
        self._check_vector_scales(mat_a, mat_b, scales_a, scales_b, bias, out_dtype)
        acc = mat_a.to(torch.float32) @ mat_b.to(torch.float32)
        return self._epilogue(acc, scales_a, scales_b, bias, out_dtype)

    def fp8_blockwise_scaled_mm(self, mat_a, mat_b, scales_a, scales_b, out_dtype):  # type: ignore[no-untyped-def]
        self.record("fp8_blockwise_scaled_mm", mat_a, mat_b, scales_a, scales_b, out_dtype)
        self._check_mm(mat_a, mat_b, out_dtype)
        self._check_fp8(mat_a, mat_b, out_dtype)
        m, k = mat_a.shape
        n = mat_b.shape[1]
        self.BLOCK_SCALES.check(
            scales_a.dtype == torch.float32 and scales_b.dtype == torch.float32
            and tuple(scales_a.shape) == (m, k // 128) and (scales_a.stride(0) == 1 or m == 1)
            and tuple(scales_b.shape) == (k // 128, n // 128) and scales_b.stride(0) == 1,
            f"scales_a {tuple(scales_a.shape)} {scales_a.stride()}, scales_b "
            f"{tuple(scales_b.shape)} {scales_b.stride()}",
        )  # fmt: skip
        a = mat_a.to(torch.float32) * scales_a.repeat_interleave(128, dim=1)
        b = mat_b.to(torch.float32) * scales_b.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return (a @ b).to(out_dtype)

    def awq_dequantize(self, qweight, scales, qzeros):  # type: ignore[no-untyped-def]
        self.record("awq_dequantize", qweight, scales, qzeros)
        self.AWQ_HALF.check(
            scales.dtype == torch.float16 and qweight.dtype == torch.int32
            and qzeros.dtype == torch.int32
            and all(t.is_contiguous() for t in (qweight, scales, qzeros)),
            f"scales {scales.dtype}, qweight {qweight.dtype}",
        )  # fmt: skip
        rows, cols = qweight.shape
        self.AWQ_GRID.check(rows % 16 == 0 and cols % 16 == 0, f"qweight {tuple(qweight.shape)}")
        group = rows // scales.shape[0]
        q, z = _awq_unpack(qweight), _awq_unpack(qzeros).repeat_interleave(group, dim=0)
        # sub.f16x2 then mul.rn.f16x2: (q - z) exact in float16, times the scale rounded once
        return (q - z).to(torch.float16) * scales.repeat_interleave(group, dim=0)

    # --- shared checks and arithmetic -----------------------------------------------------------

    def _check_mm(self, mat_a, mat_b, out_dtype):  # type: ignore[no-untyped-def]
        self.MM_LAYOUT.check(
            mat_a.dim() == 2 and mat_b.dim() == 2 and mat_a.stride(1) == 1
            and mat_b.stride(0) == 1 and mat_a.shape[1] == mat_b.shape[0],
            f"mat_a {tuple(mat_a.shape)} {mat_a.stride()}, mat_b {tuple(mat_b.shape)} "
            f"{mat_b.stride()}",
        )  # fmt: skip
        self.MM_OUT_DTYPE.check(out_dtype in HALF, str(out_dtype))

    def _check_fp8(self, mat_a, mat_b, out_dtype):  # type: ignore[no-untyped-def]
        self.FP8_ALIGN.check(
            mat_a.dtype == FP8 and mat_b.dtype == FP8 and mat_a.shape[1] % 16 == 0
            and mat_b.shape[1] * out_dtype.itemsize % 16 == 0,
            f"{mat_a.dtype} {tuple(mat_a.shape)} x {mat_b.dtype} {tuple(mat_b.shape)}",
        )  # fmt: skip

    def _check_vector_scales(self, mat_a, mat_b, scales_a, scales_b, bias, out_dtype):  # type: ignore[no-untyped-def]
        self.MM_SCALES.check(
            scales_a.numel() == mat_a.shape[0] and scales_b.numel() == mat_b.shape[1]
            and scales_a.dtype == torch.float32 and scales_b.dtype == torch.float32
            and scales_a.is_contiguous() and scales_b.is_contiguous(),
            f"scales_a {scales_a.dtype} {tuple(scales_a.shape)}, scales_b {scales_b.dtype} "
            f"{tuple(scales_b.shape)}",
        )  # fmt: skip
        if bias is not None:
            self.MM_BIAS.check(
                bias.numel() == mat_b.shape[1] and bias.dtype == out_dtype and bias.is_contiguous(),
                f"bias {bias.dtype} {tuple(bias.shape)}",
            )

    @staticmethod
    def _epilogue(acc, scales_a, scales_b, bias, out_dtype):  # type: ignore[no-untyped-def]
        out = acc * scales_a.reshape(-1, 1) * scales_b.reshape(1, -1)
        if bias is not None:
            out = out + bias.to(torch.float32)
        return out.to(out_dtype)


def _awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 words -> columns, in AutoAWQ's reverse order [0, 4, 1, 5, 2, 6, 3, 7]."""
    shifts = (0, 4, 1, 5, 2, 6, 3, 7)
    columns = [(packed >> (4 * shifts[i])) & 0xF for i in range(8)]
    return torch.stack(columns, dim=-1).reshape(packed.shape[0], -1)


FUSED_EXPERTS_QUANT = (
    "SGLang 0.5.23 moe_runner/triton_utils/fused_moe.py, fused_experts_impl with use_int8_w8a8 / "
    "use_fp8_w8a8 (its per-token and per-token-group activation quantization: "
    "quantization/int8_kernel.py per_token_quant_int8, fp8_kernel.py per_token_group_quant_fp8)"
)


class SglangTritonQuantMoeDouble(SglangTritonMoeDouble):
    """SGLang's Triton fused experts with their W8A8 int8 and FP8 paths: activations quantized
    per token (FP8 block: per token and group of ``block_shape[1]``) by absmax / qmax in
    float32, the quantized products in float32 (what the Triton kernel accumulates)."""

    QUANT_SCALES = Constraint(
        "outplace_fused_experts",
        "w1_scale/w2_scale float32 [experts, N, 1] with per_channel_quant, or [experts, "
        "ceil(N / block_n), K / block_k] with block_shape",
        f"{FUSED_EXPERTS_QUANT}: the scales the kernel indexes by expert, row (block) and "
        "column block",
        "reads the wrong scales",
    )

    def outplace_fused_experts(  # type: ignore[no-untyped-def, override]
        self, hidden_states, w1, w2, topk_weights, topk_ids,
        b1=None, b2=None, activation="silu", is_gated=True, **options,
    ):  # fmt: skip
        quantized = options.get("use_int8_w8a8") or options.get("use_fp8_w8a8")
        if not quantized:
            return super().outplace_fused_experts(
                hidden_states, w1, w2, topk_weights, topk_ids, b1, b2, activation, is_gated,
                **options,
            )  # fmt: skip
        self.record("outplace_fused_experts", hidden_states, w1, w2, topk_weights, topk_ids,
                    activation=activation, is_gated=is_gated, **options)  # fmt: skip
        self.FUSED_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (hidden_states, w1, w2)), "non-contiguous operands"
        )
        self.FUSED_RUNTIME.check(self.published, "no SGLang runtime context published")
        block = options.get("block_shape")
        s1, s2 = options["w1_scale"], options["w2_scale"]
        experts = w1.shape[0]
        if block is None:
            shapes_ok = (
                bool(options.get("per_channel_quant"))
                and tuple(s1.shape) == (experts, w1.shape[1], 1)
                and tuple(s2.shape) == (experts, w2.shape[1], 1)
            )
        else:
            bn, bk = block
            shapes_ok = tuple(s1.shape) == (experts, -(-w1.shape[1] // bn), w1.shape[2] // bk)
        self.QUANT_SCALES.check(bool(shapes_ok), f"w1_scale {tuple(s1.shape)}, block {block}")
        from sglang_fl.ops import get_contract

        op = "fused_moe_w8a8_int8" if options.get("use_int8_w8a8") else "fused_moe_w8a8_fp8"
        layer = SimpleNamespace(act_quant="absmax", weight_block_size=block)
        if block is None:
            s1, s2 = s1.squeeze(-1), s2.squeeze(-1)
        act = {"silu": "silu", "gelu_tanh": "gelu"}[activation]
        result: torch.Tensor = get_contract(op).reference(
            layer, hidden_states, w1, w2, s1, s2, topk_weights, topk_ids, act
        )
        return result
