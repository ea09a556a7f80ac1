"""A TEST DOUBLE of ``sgl_kernel`` (``sglang-kernel`` 0.4.x): its kernels in PyTorch, on the CPU.

Kernels: the act-and-mul kernels (``silu_and_mul``, ``gelu_and_mul``, ``gelu_tanh_and_mul``,
which share one wrapper check and one CUDA template), the RMS norms (``rmsnorm``,
``fused_add_rmsnorm``, and FlashInfer's Gemma variants ``gemma_rmsnorm``,
``gemma_fused_add_rmsnorm``, which scale by ``1 + weight``) and ``rotary_embedding``.

Not the real SDK. It stands in for ``sgl_kernel`` in ``sys.modules`` so the adapters can be
checked here without a GPU: same function names, argument order, in-place writes and return
values as the wheel's Python API (``sgl_kernel/elementwise.py`` of ``sglang-kernel`` 0.4.10,
the version SGLang 0.5.23 pins), and every precondition of those kernels, each a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source: the wrapper's own checks, the
op schemas and ``TORCH_CHECK`` messages compiled into ``sgl_kernel/sm90/common_ops.abi3.so``
(``strings`` shows them), the MoE wrapper's documented operands (``sgl_kernel/moe.py``), and
the addressing of the kernels (FlashInfer's ``norm.cuh``, vLLM's
``pos_enc.cu``) where a violation is not checked but reads the wrong memory or crashes. A call
the real kernel would reject raises :class:`~sglang_fl.testing.doubles.ConstraintViolation`.
Every call is recorded in :attr:`SglKernelDouble.calls`. Options the double does not model
(softcapping, Triton MoE biases) raise ``NotImplementedError`` rather than a wrong result.

:class:`SglangTritonMoeDouble` does the same for SGLang's Triton fused experts, which the
``fused_moe`` adapter calls (SGLang is a real dependency, but its Triton kernels need a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from sglang_fl_cuda.impl.moe import SGLANG_FUSED_MOE

from sglang_fl.testing.doubles import Constraint, SdkDouble

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, *HALF)

WRAPPER = "sgl_kernel/elementwise.py (sglang-kernel 0.4.10)"
LIBRARY = "TORCH_CHECK in sgl_kernel/sm90/common_ops.abi3.so (sglang-kernel 0.4.10)"
NORM_CU = f"{LIBRARY}, csrc/elementwise/fused_add_rms_norm_kernel.cu and FlashInfer norm.cuh"
POS_ENC = f"{LIBRARY}, csrc/elementwise/pos_enc.cu"
ACT_AND_MUL = "silu_and_mul/gelu_and_mul/gelu_tanh_and_mul"
NORMS = "rmsnorm/fused_add_rmsnorm/gemma_rmsnorm/gemma_fused_add_rmsnorm"
MOE_WRAPPER = "sgl_kernel/moe.py (sglang-kernel 0.4.x), topk_softmax/topk_sigmoid docstrings"
MOE_CU = f"{LIBRARY}, csrc/moe/moe_topk_softmax_kernels.cu"
# SGLang 0.5.23: python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py
FUSED_EXPERTS = "SGLang 0.5.23 moe_runner/triton_utils/fused_moe.py, fused_experts_impl's asserts"
FUSED_EXPERTS_FILE = "SGLang 0.5.23 moe_runner/triton_utils/fused_moe.py, fused_experts_impl"
# SGLang 0.5.23 python/sglang/srt/runtime_context.py
RUNTIME_CONTEXT = "SGLang 0.5.23 srt/runtime_context.py"
# FlashInfer's kernel, which sgl_kernel's activation.cu launches (include/flashinfer/...).
ACT_KERNEL = "FlashInfer include/flashinfer/activation.cuh, act_and_mul_kernel"
ACT_LAUNCH = "sgl-kernel csrc/elementwise/activation.cu (sglang-kernel 0.4.10), silu_and_mul etc."
EMPTY_GRID = (
    "fails: it launches one CUDA block per token, and a launch with 0 blocks is an invalid "
    "configuration (CUDA C++ Programming Guide, execution configuration)"
)


class SglKernelDouble(SdkDouble):
    """``sgl_kernel`` stand-in: the act-and-mul kernels, the (Gemma) RMS norms, rope,
    ``topk_softmax`` and ``topk_sigmoid``."""

    # -- silu_and_mul / gelu_and_mul / gelu_tanh_and_mul(input, out=None) -> out --------------
    # One wrapper check each in elementwise.py and one template in activation.cu: shared rules.
    ACT_ROW_BYTES = Constraint(
        ACT_AND_MUL,
        "rows of a multiple of 16 bytes",
        f'{WRAPPER}: raise ValueError("The pointers must be multiple of 16 bytes.")',
        "raises ValueError",
    )
    ACT_OUT_SHAPE = Constraint(
        ACT_AND_MUL,
        "out of input's shape with the last dim halved",
        f"{WRAPPER}: _check_shape asserts",
        "raises AssertionError",
    )
    ACT_HALF_ROW = Constraint(
        ACT_AND_MUL,
        "each half row (d = input.shape[-1] / 2 values) a whole number of 16-byte vectors",
        f"{ACT_KERNEL}: loads the gate at input + t * 2d and the up half at input + t * 2d + d "
        f"with 16-byte vec_t::cast_load; {ACT_LAUNCH}: dim3 block(min(d / vec_size, 1024))",
        "faults on misaligned vector loads, or with d < 16 / itemsize launches blocks of 0 "
        "threads (an invalid configuration, or an output never written)",
    )
    ACT_DTYPE = Constraint(
        ACT_AND_MUL,
        "float32/float16/bfloat16 input, and out in input's dtype",
        f"{ACT_LAUNCH}: DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FLOAT_FP16 on input's scalar type, and "
        "out.data_ptr() cast to input's c_type",
        "raises for another input dtype; writes out's bytes as input's element type",
    )
    ACT_CONTIGUOUS = Constraint(
        ACT_AND_MUL,
        "contiguous input and out",
        "csrc/elementwise/activation.cu addresses token t's row at t * 2d (no strides)",
        "reads and writes the wrong elements",
    )
    ACT_ALIGNED = Constraint(
        ACT_AND_MUL,
        "input and out starting at 16-byte aligned addresses",
        f"{ACT_KERNEL}: 16-byte vec_t::cast_load from input and cast_store to out "
        "(FlashInfer include/flashinfer/vec_dtypes.cuh)",
        "faults (misaligned address)",
    )
    ACT_TOKENS = Constraint(ACT_AND_MUL, "at least one token", "activation.cu", EMPTY_GRID)

    # -- rmsnorm(input, weight, eps, out=None) -> out; fused_add_rmsnorm(...) -> None ---------
    NORM_SHAPES = Constraint(
        NORMS,
        "2-D input [batch, hidden] (and residual of the same shape), 1-D weight [hidden]",
        f"{NORM_CU}: 'input must be a 2D tensor', 'weight must be a 1D tensor', "
        "'CHECK_EQ(input.size(1), weight.size(0))'",
    )
    NORM_CONTIGUOUS = Constraint(
        NORMS,
        "contiguous input, residual and weight",
        f"{NORM_CU}: CHECK_INPUT ('residual must be contiguous', ...)",
    )
    NORM_DTYPE = Constraint(
        NORMS,
        "weight (and residual) in input's dtype",
        f"{NORM_CU}: the kernels read every operand as input's element type",
        "reads the weight's bytes as the wrong type",
    )
    RMSNORM_HALF = Constraint(
        "rmsnorm",
        "float16 or bfloat16 input",
        f"{WRAPPER}: _FLASHINFER_NORM_SUPPORTED_DTYPES, and the fallback kernel dispatches "
        "fp16/bf16 only",
        "raises 'not implemented for Float'",
    )
    GEMMA_HALF = Constraint(
        "gemma_rmsnorm/gemma_fused_add_rmsnorm",
        "float16 or bfloat16 input",
        f"{WRAPPER}: gemma_rmsnorm/gemma_fused_add_rmsnorm call FlashInfer's kernels, "
        "dispatched by DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FP16 (FlashInfer csrc/norm.cu)",
        "raises 'not implemented for Float'",
    )
    FUSED_ADD_DTYPE = Constraint(
        "fused_add_rmsnorm",
        "float32, float16 or bfloat16 input",
        f"{NORM_CU}: sgl_fused_add_rmsnorm dispatches these three",
    )
    NORM_TOKENS = Constraint(NORMS, "at least one row", NORM_CU, EMPTY_GRID)

    # -- rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> None ---
    ROPE_POSITIONS = Constraint(
        "rotary_embedding",
        "contiguous int64 positions of shape [num_tokens]",
        f"{POS_ENC}: 'positions must have shape [num_tokens] or [batch_size, seq_len]'; the "
        "kernel reads positions as int64_t",
    )
    ROPE_TOKENS_MATCH = Constraint(
        "rotary_embedding",
        "query, key and positions with the same number of tokens",
        f"{POS_ENC}: 'query, key and positions must have the same number of tokens'",
    )
    ROPE_HEAD_SIZE = Constraint(
        "rotary_embedding",
        "query and key hidden sizes divisible by head_size",
        f"{POS_ENC}: 'Expected query_hidden_size % head_size == 0', 'key_hidden_size % ...'",
    )
    ROPE_GQA = Constraint(
        "rotary_embedding",
        "num_heads divisible by num_kv_heads",
        f"{POS_ENC}: 'Expected num_heads % num_kv_heads == 0'",
    )
    ROPE_DTYPE = Constraint(
        "rotary_embedding",
        "float32/float16/bfloat16 query and key, and a 2-D contiguous cos_sin_cache in their dtype",
        f"{POS_ENC}: dispatches on query's dtype and reads the cache as that type",
        "reads the cache's bytes as the wrong type",
    )
    ROPE_LAYOUT = Constraint(
        "rotary_embedding",
        "a unit stride in the last dim of query and key, and key's head stride equal to query's",
        f"{POS_ENC}: token strides from stride(0), one head stride (query.stride(-2)) for both",
        "reads and writes the wrong elements",
    )
    ROPE_NOT_EMPTY = Constraint(
        "rotary_embedding",
        "at least one token",
        f"{POS_ENC}: query_hidden_size = query.numel() / num_tokens",
        "divides by zero (SIGFPE kills the process)",
    )

    # -- topk_softmax / topk_sigmoid(topk_weights, topk_ids, gating_output, renormalize, ...)
    #    -> None: both write topk_weights and topk_ids in place -----------------------------
    TOPK_OUTPUTS = Constraint(
        "topk_softmax/topk_sigmoid",
        "float32 topk_weights and int32 topk_ids, both [num_tokens, topk]",
        f"{MOE_WRAPPER}: 'topk_weights: [num_tokens, topk], float32', 'topk_ids: "
        "[num_tokens, topk], int32'",
        "writes the wrong element type",
    )
    TOPK_GATING = Constraint(
        "topk_softmax/topk_sigmoid",
        "2-D float32/float16/bfloat16 gating_output [num_tokens, num_experts] with the outputs' "
        "rows and at least topk experts",
        f"{MOE_WRAPPER}: 'gating_output: [num_tokens, num_experts], float32/16/bf16'",
    )
    TOPK_CONTIGUOUS = Constraint(
        "topk_softmax/topk_sigmoid",
        "contiguous gating_output, topk_weights and topk_ids",
        f"{MOE_CU}: row r is addressed at r * num_experts (and r * topk), without strides",
        "reads and writes the wrong elements",
    )
    TOPK_BIAS = Constraint(
        "topk_softmax/topk_sigmoid",
        "a float32 correction_bias [num_experts] when one is given",
        f"{MOE_WRAPPER}: 'correction_bias: [num_experts], float32 (kernel requirement)'",
    )
    # No "at least one token" rule: the current topk_softmax/topk_sigmoid return early on an
    # empty batch (the double computes nothing then, as they launch nothing).

    def __init__(self) -> None:
        super().__init__("sgl_kernel")

    def silu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.record("silu_and_mul", input, out)
        return self._act_and_mul(F.silu, input, out)

    def gelu_and_mul(self, input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.record("gelu_and_mul", input, out)
        return self._act_and_mul(F.gelu, input, out)

    def gelu_tanh_and_mul(
        self, input: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.record("gelu_tanh_and_mul", input, out)
        return self._act_and_mul(lambda gate: F.gelu(gate, approximate="tanh"), input, out)

    def rmsnorm(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        out: torch.Tensor | None = None,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor:
        self.record("rmsnorm", input, weight, eps, out)
        self.RMSNORM_HALF.check(input.dtype in HALF, str(input.dtype))
        self._check_norm(input, weight)
        return _norm_into(out, input, weight, eps)

    def fused_add_rmsnorm(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        enable_pdl: bool | None = None,
    ) -> None:
        self.record("fused_add_rmsnorm", input, residual, weight, eps)
        self.FUSED_ADD_DTYPE.check(input.dtype in FLOATS, str(input.dtype))
        self._check_norm(input, weight, residual)
        _add_then_norm(input, residual, weight, eps)

    def gemma_rmsnorm(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        out: torch.Tensor | None = None,
        enable_pdl: bool | None = None,
    ) -> torch.Tensor:
        self.record("gemma_rmsnorm", input, weight, eps, out)
        self.GEMMA_HALF.check(input.dtype in HALF, str(input.dtype))
        self._check_norm(input, weight)
        return _norm_into(out, input, 1.0 + weight.float(), eps)  # scale 1 + weight

    def gemma_fused_add_rmsnorm(
        self,
        input: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-6,
        enable_pdl: bool | None = None,
    ) -> None:
        self.record("gemma_fused_add_rmsnorm", input, residual, weight, eps)
        self.GEMMA_HALF.check(input.dtype in HALF, str(input.dtype))
        self._check_norm(input, weight, residual)
        _add_then_norm(input, residual, 1.0 + weight.float(), eps)  # scale 1 + weight

    def rotary_embedding(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool = True,
    ) -> None:
        self.record("rotary_embedding", positions, query, key, head_size, cos_sin_cache, is_neox)
        tensors = [query] if key is None else [query, key]
        self.ROPE_POSITIONS.check(
            positions.dtype == torch.int64 and positions.dim() == 1 and positions.is_contiguous(),
            f"{positions.dtype} {tuple(positions.shape)}",
        )
        num_tokens = positions.shape[0]
        self.ROPE_TOKENS_MATCH.check(
            all(t.shape[0] == num_tokens for t in tensors),
            f"{num_tokens} positions, {[t.shape[0] for t in tensors]} rows",
        )
        self.ROPE_NOT_EMPTY.check(num_tokens > 0, "0 tokens")
        hidden = [t.numel() // num_tokens for t in tensors]
        self.ROPE_HEAD_SIZE.check(all(h % head_size == 0 for h in hidden), f"{hidden}/{head_size}")
        heads = [h // head_size for h in hidden]
        self.ROPE_GQA.check(heads[0] % heads[-1] == 0, f"{heads[0]} heads, {heads[-1]} kv heads")
        self.ROPE_DTYPE.check(
            query.dtype in FLOATS
            and all(t.dtype == query.dtype for t in tensors)
            and cos_sin_cache.dtype == query.dtype
            and cos_sin_cache.dim() == 2
            and cos_sin_cache.is_contiguous(),
            f"query {query.dtype}, cache {cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)}",
        )
        head_stride = query.stride(-2) if query.dim() == 3 else head_size
        self.ROPE_LAYOUT.check(
            all(t.stride(-1) == 1 for t in tensors)
            and all(t.dim() != 3 or t.stride(-2) == head_stride for t in tensors),
            _strides(query=query, key=key),
        )
        rot_dim = cos_sin_cache.shape[1]
        cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        for tensor, count in zip(tensors, heads, strict=True):
            # As the kernel addresses memory: the token stride from dim 0, the query's head
            # stride for both tensors, unit stride in the last dim.
            rotated = tensor.as_strided(
                (num_tokens, count, rot_dim),
                (tensor.stride(0), head_stride, 1),
                tensor.storage_offset(),
            )
            rotated.copy_(_rotate(rotated, cos, sin, is_neox))

    def _act_and_mul(
        self,
        act: Callable[[torch.Tensor], torch.Tensor],
        input: torch.Tensor,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """The act-and-mul kernels' shared checks, then ``act(x[..., :d]) * x[..., d:]``."""
        self.ACT_ROW_BYTES.check(input.shape[-1] * input.dtype.itemsize % 16 == 0, _row(input))
        d = input.shape[-1] // 2
        self.ACT_HALF_ROW.check(
            d > 0 and d * input.dtype.itemsize % 16 == 0, f"d={d} x {input.dtype}"
        )
        if out is None:
            out = torch.empty((*input.shape[:-1], d), dtype=input.dtype, device=input.device)
        halved = (*input.shape[:-1], d)
        self.ACT_OUT_SHAPE.check(tuple(out.shape) == halved, f"out {tuple(out.shape)}")
        self.ACT_DTYPE.check(
            input.dtype in FLOATS and out.dtype == input.dtype, f"{input.dtype} -> {out.dtype}"
        )
        self.ACT_CONTIGUOUS.check(
            input.is_contiguous() and out.is_contiguous(), _strides(input=input, out=out)
        )
        self.ACT_ALIGNED.check(input.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0)
        self.ACT_TOKENS.check(input.numel() > 0, f"input {tuple(input.shape)}")
        # act_and_mul_kernel: both halves loaded as float, act(x) * y in float32, rounded once
        # by cast_store into out's dtype.
        out.copy_(act(input[..., :d].float()) * input[..., d:].float())
        return out

    def topk_softmax(
        self,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        gating_output: torch.Tensor,
        renormalize: bool = False,
        moe_softcapping: float = 0.0,
        correction_bias: torch.Tensor | None = None,
    ) -> None:
        self.record("topk_softmax", topk_weights, topk_ids, gating_output, renormalize)
        self._check_router(topk_weights, topk_ids, gating_output, correction_bias)
        _unmodeled(moe_softcapping == 0.0, "topk_softmax with moe_softcapping")
        _route(topk_weights, topk_ids, gating_output.float().softmax(dim=-1), renormalize)

    def topk_sigmoid(
        self,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        gating_output: torch.Tensor,
        renormalize: bool = False,
        correction_bias: torch.Tensor | None = None,
    ) -> None:
        self.record("topk_sigmoid", topk_weights, topk_ids, gating_output, renormalize)
        self._check_router(topk_weights, topk_ids, gating_output, correction_bias)
        _route(topk_weights, topk_ids, gating_output.float().sigmoid(), renormalize)

    def _check_router(
        self,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        gating_output: torch.Tensor,
        correction_bias: torch.Tensor | None,
    ) -> None:
        self.TOPK_OUTPUTS.check(
            topk_weights.dtype == torch.float32
            and topk_ids.dtype == torch.int32
            and topk_weights.dim() == 2
            and topk_weights.shape == topk_ids.shape,
            f"weights {topk_weights.dtype} {tuple(topk_weights.shape)}, ids {topk_ids.dtype} "
            f"{tuple(topk_ids.shape)}",
        )
        self.TOPK_GATING.check(
            gating_output.dim() == 2
            and gating_output.dtype in FLOATS
            and gating_output.shape[0] == topk_ids.shape[0]
            and gating_output.shape[1] >= topk_ids.shape[1],
            f"gating_output {gating_output.dtype} {tuple(gating_output.shape)}, topk "
            f"{tuple(topk_ids.shape)}",
        )
        self.TOPK_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (gating_output, topk_weights, topk_ids)),
            _strides(gating_output=gating_output, topk_weights=topk_weights, topk_ids=topk_ids),
        )
        self.TOPK_BIAS.check(
            correction_bias is None
            or (
                correction_bias.dtype == torch.float32
                and tuple(correction_bias.shape) == (gating_output.shape[1],)
            ),
            ""
            if correction_bias is None
            else f"{correction_bias.dtype} {tuple(correction_bias.shape)}",
        )

    def _check_norm(
        self, input: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None
    ) -> None:
        operands = [input] if residual is None else [input, residual]
        self.NORM_SHAPES.check(
            input.dim() == 2
            and weight.dim() == 1
            and weight.shape[0] == input.shape[-1]
            and all(t.shape == input.shape for t in operands),
            f"input {tuple(input.shape)}, weight {tuple(weight.shape)}",
        )
        self.NORM_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (*operands, weight)),
            _strides(input=input, residual=residual, weight=weight),
        )
        self.NORM_DTYPE.check(
            all(t.dtype == input.dtype for t in (*operands, weight)),
            f"input {input.dtype}, weight {weight.dtype}",
        )
        self.NORM_TOKENS.check(input.shape[0] > 0, f"input {tuple(input.shape)}")


class SglangTritonMoeDouble(SdkDouble):
    """A TEST DOUBLE of SGLang's ``moe_runner/triton_utils/fused_moe.py`` (SGLang 0.5.23): its
    ``outplace_fused_experts`` -> a new ``[num_tokens, hidden]`` tensor, with the preconditions
    ``fused_experts_impl`` asserts, computed with PyTorch on the CPU.

    The module's ``get_exec`` and ``get_parallel`` (imported there from SGLang's
    ``runtime_context``) behave as SGLang's: outside a running SGLang worker (``published`` is
    false) reading ``get_exec()`` raises ``ValueError`` and ``get_parallel().tp_group``
    ``RuntimeError``, and ``outplace_fused_experts``, which reads both, refuses the call.
    """

    FUSED_RUNTIME = Constraint(
        "outplace_fused_experts",
        "SGLang's runtime context published in this process (a running SGLang worker)",
        f"{FUSED_EXPERTS_FILE} reads get_parallel().tp_group (use_symmetric_memory) and "
        f"get_exec().moe.enable_fused_moe_sum_all_reduce; {RUNTIME_CONTEXT}: "
        "RuntimeContext.config_bag raises ValueError \"config namespace 'exec' not published\", "
        "ParallelContext._read raises RuntimeError for a group never written",
        "raises ValueError or RuntimeError",
    )
    FUSED_ACTIVATION = Constraint(
        "outplace_fused_experts",
        "a gated activation SGLang's Triton path computes: 'silu', 'gelu' (erf) or 'gelu_tanh'",
        f"{FUSED_EXPERTS_FILE}: activation == 'silu' ... elif activation in ('gelu', "
        "'gelu_tanh') and is_gated: gelu_tanh_and_mul if activation == 'gelu_tanh' else "
        "gelu_and_mul",
        "raises ValueError (unsupported activation)",
    )

    FUSED_HIDDEN = Constraint(
        "outplace_fused_experts",
        "hidden_states [num_tokens, hidden] and w1 [experts, 2 * inter, hidden] of one hidden size",
        f"{FUSED_EXPERTS}: 'Hidden size mismatch'",
        "raises AssertionError",
    )
    FUSED_TOPK = Constraint(
        "outplace_fused_experts",
        "topk_weights and topk_ids of one shape",
        f"{FUSED_EXPERTS}: 'topk shape mismatch'",
        "raises AssertionError",
    )
    FUSED_CONTIGUOUS = Constraint(
        "outplace_fused_experts",
        "contiguous hidden_states, w1 and w2",
        f"{FUSED_EXPERTS}: 'Hidden_states must be contiguous', 'Expert weights1 must be "
        "contiguous', 'Expert weights2 must be contiguous'",
        "raises AssertionError",
    )
    FUSED_DTYPE = Constraint(
        "outplace_fused_experts",
        "float32/float16/bfloat16 hidden_states",
        f"{FUSED_EXPERTS}: hidden_states.dtype in [torch.float32, torch.float16, torch.bfloat16]",
        "raises AssertionError",
    )

    def __init__(self, *, published: bool = True) -> None:
        super().__init__(SGLANG_FUSED_MOE)
        self.published = published

    def get_exec(self) -> SimpleNamespace:
        """SGLang's ``get_exec()``: the published ``exec`` config bag."""
        if not self.published:
            raise ValueError("config namespace 'exec' not published")
        return SimpleNamespace(moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False))

    def get_parallel(self) -> Any:
        """SGLang's ``get_parallel()``: its ``tp_group`` exists once a worker built its groups."""
        published = self.published

        class Parallel:
            @property
            def tp_group(self) -> object:
                if not published:
                    raise RuntimeError("parallel name 'tp_group' has not been written")
                return object()

        return Parallel()

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
        self.record(
            "outplace_fused_experts",
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation=activation,
            is_gated=is_gated,
            **options,
        )
        self.FUSED_HIDDEN.check(
            hidden_states.shape[1] == w1.shape[2],
            f"hidden_states {tuple(hidden_states.shape)}, w1 {tuple(w1.shape)}",
        )
        self.FUSED_TOPK.check(
            topk_weights.shape == topk_ids.shape,
            f"{tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}",
        )
        self.FUSED_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (hidden_states, w1, w2)),
            _strides(hidden_states=hidden_states, w1=w1, w2=w2),
        )
        self.FUSED_DTYPE.check(hidden_states.dtype in FLOATS, str(hidden_states.dtype))
        self.FUSED_ACTIVATION.check(activation in _GATED_ACTIVATIONS, repr(activation))
        self.FUSED_RUNTIME.check(self.published, "no SGLang runtime context published")
        # float32 runs in TF32 (tl.dot's default precision) on the GPU: the double does not
        # fake a full-precision result the real kernel does not give.
        _unmodeled(hidden_states.dtype in HALF, "float32 fused experts (TF32 on the GPU)")
        _unmodeled(b1 is None and b2 is None and is_gated and not options, "biases, options")
        gate_up = torch.einsum("th,tkeh->tke", hidden_states.float(), w1.float()[topk_ids.long()])
        d = gate_up.shape[-1] // 2
        gate = gate_up[..., :d]
        act = _GATED_ACTIVATIONS[activation](gate)
        hidden = (act * gate_up[..., d:]).to(hidden_states.dtype).float()
        down = torch.einsum("tki,tkhi->tkh", hidden, w2.float()[topk_ids.long()])
        return (down * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(hidden_states.dtype)


# SGLang's Triton path: 'gelu' is gelu_and_mul (erf), 'gelu_tanh' gelu_tanh_and_mul.
_GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda gate: F.gelu(gate, approximate="tanh"),
}


def _unmodeled(holds: bool, what: str) -> None:
    """Refuse a call the double does not compute (the real kernel may accept it)."""
    if not holds:
        raise NotImplementedError(f"the test double does not model {what}")


def _route(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, scores: torch.Tensor, renormalize: bool
) -> None:
    values, ids = torch.topk(scores, topk_ids.shape[1], dim=-1)
    if renormalize:
        values = values / values.sum(dim=-1, keepdim=True)
    topk_weights.copy_(values)
    topk_ids.copy_(ids)


def _row(tensor: torch.Tensor) -> str:
    return f"{tensor.shape[-1]} x {tensor.dtype}"


def _strides(**tensors: torch.Tensor | None) -> str:
    return ", ".join(f"{n} strides {t.stride()}" for n, t in tensors.items() if t is not None)


def _norm_into(
    out: torch.Tensor | None, input: torch.Tensor, gamma: torch.Tensor, eps: float
) -> torch.Tensor:
    """The unfused norms: ``norm(input) * gamma`` in float32, rounded into ``out`` (or new)."""
    if out is None:
        out = torch.empty_like(input)
    out.copy_(_normalise(input.float(), gamma, eps).to(input.dtype))
    return out


def _add_then_norm(
    input: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float
) -> None:
    """The fused norms, in place: ``residual += input``, then ``input = norm(residual) * gamma``."""
    total = input.float() + residual.float()
    residual.copy_(total)
    input.copy_(_normalise(total, gamma, eps))


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
