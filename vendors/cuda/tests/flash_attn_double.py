"""A TEST DOUBLE of ``sgl_kernel.flash_attn`` (sgl_kernel's FlashAttention-3 wrapper module).

Not the real SDK. It stands in for ``sgl_kernel.flash_attn`` in ``sys.modules`` with the two
functions SGLang's ``fa3`` backend and the adapters use: ``is_fa3_supported(device=None)`` and
``flash_attn_with_kvcache(q, k_cache, v_cache, ..., page_table=, cache_seqlens=,
cu_seqlens_q=, max_seqlen_q=, softmax_scale=, causal=, window_size=, softcap=)`` -> ``out``
(``[total_q, heads, v_head_dim]`` for varlen ``q``). It computes the documented semantics in
PyTorch on the CPU: paged KV through the page table, GQA head grouping, a bottom-right aligned
causal mask, the ``(left, right)`` window, ``softcap * tanh(scale * qk / softcap)``.

Its constraints are those of the wrapper (``sgl_kernel/flash_attn.py`` of sglang-kernel 0.4.10)
and of ``mha_fwd`` in FlashAttention-3's ``hopper/flash_api.cpp`` (line numbers of
Dao-AILab/flash-attention 0251105), the source sgl_kernel builds its ``fwd`` op from, each a
:class:`~sglang_fl.testing.doubles.Constraint` naming its source. The double emulates one GPU:
an sm90 (Hopper) with CUDA 12.4 by default, another with ``FlashAttnDouble(capability=(8, 0))``
or ``(12, 0)``, an old toolkit with ``cuda="12.2"``; ``is_fa3_supported`` answers from them as
the real one does, and :meth:`FlashAttnDouble.get_device_capability` stands in for
``torch.cuda.get_device_capability`` (the ``flash_attn`` fixture installs it), so adapter and
double see one GPU. Options the adapters never pass (appending K/V, rotary, fp8 descales,
``qv``, LSE output, batch indices, left padding) raise ``NotImplementedError``.

The computation runs as a ``torch.library`` custom op with a fake implementation, as
sgl_kernel's ``fwd`` is an operator (``torch.ops.sgl_kernel.fwd``): its value-dependent work
(reading the page table and lengths) happens inside the kernel, never in the caller's Python,
so the conformance kit's host-read check sees what it would see on a GPU.

Not a constraint, on purpose: the wrapper's docstring says ``page_block_size must be a
multiple of 256``. That sentence is FlashAttention-2's rule; FA3's ``mha_fwd`` takes
``page_size = k.size(1)`` without such a check, and SGLang 0.5.23's ``fa3`` backend runs FA3
with its default page size 1 (``flashattention_backend.py``: ``paged_kv_view(key_cache,
self.page_size, ...)``).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.testing.doubles import Constraint, SdkDouble

WRAPPER = "sgl_kernel/flash_attn.py flash_attn_with_kvcache"
MHA_FWD = "FlashAttention-3 hopper/flash_api.cpp mha_fwd"
# sgl_kernel/flash_attn.py:16-28 (sglang-kernel 0.4.10).
IS_FA3_SUPPORTED = "sgl_kernel/flash_attn.py:16-28 is_fa3_supported"
FA = "flash_attn_with_kvcache"
HALF = (torch.float16, torch.bfloat16)


class FlashAttnDouble(SdkDouble):
    """``sgl_kernel.flash_attn`` stand-in on one emulated GPU (sm90 and CUDA 12.4 by default)."""

    FA3_DEVICE = Constraint(
        FA,
        "a GPU sgl_kernel builds FA3 for: compute capability 8.x or 9.x with CUDA >= 12.3, "
        "where is_fa3_supported() holds (sm80/86/89/90)",
        f"{IS_FA3_SUPPORTED} (torch.version.cuda >= '12.3' and major 8 or 9; 'we can build fa3 "
        "on sm80/sm86/sm89/sm90a'); sglang-kernel 0.4.10's flash_ops.abi3.so embeds cubins for "
        "sm_80, sm_86 and sm_90a only. flash_attn_with_kvcache does not ask is_fa3_supported "
        "(only flash_attn_varlen_func raises NotImplementedError, flash_attn.py:306-309); "
        f"{MHA_FWD}:711-712 checks major >= 8 ('FlashAttention only supports Ampere GPUs or "
        "newer') and hopper/static_switch.h ARCH_SWITCH sends arch >= 90 to the sm90 kernels",
        "has no kernel image for the GPU (sm100, sm120: the launch fails) or raises",
    )
    DTYPE = Constraint(
        FA,
        "float16/bfloat16 q, and k_cache/v_cache in q's dtype (fp8_e4m3 too, on Hopper with "
        "descales: not modeled, so refused)",
        f"{MHA_FWD}:715-722: 'FlashAttention only supports fp16, bf16, and fp8_e4m3 data type', "
        "'FlashAttention on Ampere/Ada cards only supports fp16 and bf16 data type', 'query "
        "and key must have the same dtype', 'query and value must have the same dtype'",
    )
    LAST_DIM = Constraint(
        FA,
        "k_cache and v_cache with a contiguous last dimension",
        f"{WRAPPER} (flash_attn.py:165, 186): assert k_cache.stride(-1) == 1, 'k_cache must "
        "have contiguous last dimension' (q is made so by maybe_contiguous)",
        "raises AssertionError",
    )
    PAGED_SHAPES = Constraint(
        FA,
        "q [total_q, heads, head_dim]; k_cache [pages, page_size, kv_heads, head_dim] and "
        "v_cache [pages, page_size, kv_heads, v_head_dim] of one page count and page size",
        f"{MHA_FWD}:823-824: CHECK_SHAPE(k, num_pages, page_size, num_heads_k, head_size), "
        "CHECK_SHAPE(v, num_pages, page_size, num_heads_k, head_size_v); q (total_q, num_heads, "
        "head_size)",
    )
    PAGE_TABLE = Constraint(
        FA,
        "an int32 page_table [batch, max_pages] with a contiguous last dim",
        f"{MHA_FWD}:735-736, 777, 825: 'page_table must have dtype torch.int32', 'page_table "
        "must have contiguous last dimension', 'batch_size must be equal to batch_size_k', "
        "CHECK_SHAPE(page_table, batch_size_k, max_num_pages_per_seq)",
    )
    PAGES_COVER = Constraint(
        FA,
        "page ids inside the pool, and page_table wide enough for every cache_seqlens",
        f"{MHA_FWD}:768: seqlen_k = max_num_pages_per_seq * page_size; the kernel reads "
        "page_table[b, j] for every page of request b and k/v at that page, unchecked",
        "reads outside the page table or the pool",
    )
    VARLEN_Q = Constraint(
        FA,
        "a contiguous int32 cu_seqlens_q [batch + 1] with max_seqlen_q",
        f"{MHA_FWD}:743-745, 811: CHECK_CONTIGUOUS(cu_seqlens_q), 'cu_seqlens_q must have dtype "
        "torch.int32', 'max_seqlen_q must be provided if cu_seqlens_q is provided', "
        "CHECK_SHAPE(cu_seqlens_q, batch_size + 1)",
    )
    CACHE_SEQLENS = Constraint(
        FA,
        "a contiguous int32 cache_seqlens [batch]",
        f"{WRAPPER}: passed as seqused_k; {MHA_FWD}:836-838: 'seqused_k must have dtype "
        "int32', CHECK_CONTIGUOUS(seqused_k), CHECK_SHAPE(seqused_k, batch_size)",
    )
    HEAD_DIM = Constraint(
        FA,
        "head_dim <= 256, and head_dim and v_head_dim multiples of 8 (16-bit inputs)",
        f"{MHA_FWD}:780, 854-856: 'FlashAttention forward only supports head dimension at most "
        "256' (get_max_headdim), 'head_size should be a multiple of 8', 'head_size_v should be "
        "a multiple of 8'",
    )
    V_HEAD_DIM = Constraint(
        FA,
        "v_head_dim == head_dim, or head_dim in (128, 192] with v_head_dim in (96, 128], or "
        "head_dim <= 64 with v_head_dim <= 512",
        f"{MHA_FWD}:782-786: 'If V headdim is different from Q/K dim, we only support Q/K headdim "
        "in (128, 192] and V headdim in (96, 128], or (Q/K <= 64 and V <= 512).'",
    )
    V_HEAD_DIM_HOPPER = Constraint(
        FA,
        "v_head_dim != head_dim on a Hopper GPU (compute capability 9.x) only",
        f"{MHA_FWD}:787: TORCH_CHECK(dprops->major == 9, 'Only Hopper supports different V "
        "headdim')",
    )
    GQA = Constraint(
        FA,
        "heads a multiple of kv_heads",
        f"{MHA_FWD}:781: 'Number of heads in key/value must divide number of heads in query'",
    )

    def __init__(self, *, capability: tuple[int, int] = (9, 0), cuda: str = "12.4") -> None:
        super().__init__("sgl_kernel.flash_attn")
        self.capability = capability
        self.cuda = cuda

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        """The emulated GPU's ``torch.cuda.get_device_capability``."""
        return self.capability

    def is_fa3_supported(self, device: Any = None) -> bool:
        """As the real one: a string comparison of the CUDA version, then the major."""
        return self.cuda >= "12.3" and self.capability[0] in (8, 9)

    def flash_attn_with_kvcache(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        qv: torch.Tensor | None = None,
        rotary_cos: torch.Tensor | None = None,
        rotary_sin: torch.Tensor | None = None,
        cache_seqlens: torch.Tensor | None = None,
        cache_batch_idx: torch.Tensor | None = None,
        cache_leftpad: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k_new: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        return_softmax_lse: bool = False,
        **tuning: Any,
    ) -> torch.Tensor:
        self.record(
            FA,
            q,
            k_cache,
            v_cache,
            page_table=page_table,
            cache_seqlens=cache_seqlens,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=max_seqlen_q,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
        )
        unused = (k, v, qv, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad)
        _unmodeled(all(t is None for t in unused) and cu_seqlens_k_new is None, "new K/V, rotary")
        _unmodeled(not return_softmax_lse and not tuning, "LSE output, descales, tuning")
        if page_table is None or cu_seqlens_q is None or cache_seqlens is None:
            raise NotImplementedError("the test double does not model a non-paged or fixed q call")
        self.FA3_DEVICE.check(
            self.is_fa3_supported(), f"sm{self.capability[0]}{self.capability[1]}, CUDA {self.cuda}"
        )
        self.DTYPE.check(
            q.dtype in HALF and k_cache.dtype == q.dtype and v_cache.dtype == q.dtype,
            f"q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}",
        )
        self.LAST_DIM.check(
            k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1,
            f"strides {k_cache.stride()}, {v_cache.stride()}",
        )
        self.PAGED_SHAPES.check(
            q.dim() == 3
            and k_cache.dim() == 4
            and v_cache.dim() == 4
            and k_cache.shape[:3] == v_cache.shape[:3]
            and k_cache.shape[3] == q.shape[2],
            f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}",
        )
        batch = cu_seqlens_q.shape[0] - 1
        self.VARLEN_Q.check(
            cu_seqlens_q.dtype == torch.int32
            and cu_seqlens_q.dim() == 1
            and cu_seqlens_q.is_contiguous()
            and max_seqlen_q is not None,
            f"cu_seqlens_q {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}, max {max_seqlen_q}",
        )
        self.PAGE_TABLE.check(
            page_table.dtype == torch.int32
            and page_table.dim() == 2
            and page_table.stride(-1) == 1
            and page_table.shape[0] == batch,
            f"{page_table.dtype} {tuple(page_table.shape)} strides {page_table.stride()}, "
            f"batch {batch}",
        )
        self.CACHE_SEQLENS.check(
            cache_seqlens.dtype == torch.int32
            and cache_seqlens.is_contiguous()
            and tuple(cache_seqlens.shape) == (batch,),
            f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}",
        )
        d, dv = q.shape[2], v_cache.shape[3]
        self.HEAD_DIM.check(d <= 256 and d % 8 == 0 and dv % 8 == 0, f"{d}/{dv}")
        self.V_HEAD_DIM.check(
            dv == d or (128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512),
            f"{d}/{dv}",
        )
        self.V_HEAD_DIM_HOPPER.check(
            dv == d or self.capability[0] == 9, f"{d}/{dv} on sm{self.capability[0]}"
        )
        heads, kv_heads = q.shape[1], k_cache.shape[2]
        self.GQA.check(heads % kv_heads == 0, f"{heads}/{kv_heads}")
        scale = d**-0.5 if softmax_scale is None else softmax_scale
        out: torch.Tensor = torch.ops.sglang_fl_test.flash_attn_fwd(
            q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, scale, causal,
            window_size[0], window_size[1], softcap,
        )  # fmt: skip
        return out


@torch.library.custom_op("sglang_fl_test::flash_attn_fwd", mutates_args=())
def _forward(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> torch.Tensor:
    """The kernel: reads the page table and lengths, checks they cover the pool, attends."""
    heads, d, dv = q.shape[1], q.shape[2], v_cache.shape[3]
    kv_heads, page_size, pages = k_cache.shape[2], k_cache.shape[1], k_cache.shape[0]
    lens = cache_seqlens.tolist()
    FlashAttnDouble.PAGES_COVER.check(
        max(lens, default=0) <= page_table.shape[1] * page_size
        and all(
            0 <= int(page) < pages
            for b, length in enumerate(lens)
            for page in page_table[b, : -(-length // page_size)].tolist()
        ),
        f"page_table {tuple(page_table.shape)}, page_size {page_size}, {pages} pages, "
        f"cache_seqlens {lens}",
    )
    out = q.new_empty((q.shape[0], heads, dv))
    starts = cu_seqlens_q.tolist()
    for b, length in enumerate(lens):
        rows = slice(starts[b], starts[b + 1])
        table = page_table[b, : -(-length // page_size)].long()
        keys = k_cache[table].reshape(-1, kv_heads, d)[:length]
        values = v_cache[table].reshape(-1, kv_heads, dv)[:length]
        window = (window_left, window_right)
        out[rows] = _attention(q[rows], keys, values, scale, causal, window, softcap).to(q.dtype)
    return out


@_forward.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *rest: object,
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3]))


def _attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
) -> torch.Tensor:
    """FlashAttention's documented math for one request, in float32: ``[q_len, heads, dv]``.

    Query row ``i`` sits at key position ``i + k_len - q_len`` (bottom-right alignment); it
    sees keys within ``[pos - window[0], pos + window[1]]`` (-1: unbounded), and none after
    ``pos`` when causal. A row that sees no key is 0.
    """
    q_len, heads = q.shape[0], q.shape[1]
    k_len, kv_heads = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    k = keys.float().repeat_interleave(group, dim=1)  # [k_len, heads, d]
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    pos = torch.arange(q_len).unsqueeze(1) + (k_len - q_len)
    key = torch.arange(k_len).unsqueeze(0)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        allowed &= key >= pos - left
    if right >= 0:
        allowed &= key <= pos + right
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _unmodeled(holds: bool, what: str) -> None:
    """Refuse a call the double does not compute (the real kernel may accept it)."""
    if not holds:
        raise NotImplementedError(f"the test double does not model {what}")
