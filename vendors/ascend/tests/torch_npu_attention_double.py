"""TEST DOUBLE of torch_npu's attention operators (part of ``TorchNpuDouble``), on the CPU.

``_npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)`` -> ``None``
(writes the caches in place) and ``npu_fused_infer_attention_score(query, key, value, *, ...)``
-> ``(attention_out, softmax_lse)`` in the two forms SGLang's Ascend backend calls: PageAttention
decode in the ``BSH`` layout, PageAttention extend in ``TND``. The math is the API reference's:
``softmax(scale * q k^T + mask) v`` over the keys each request's ``block_table`` row and
``actual_seq_lengths_kv`` select; ``sparse_mode`` 3 masks right-down causally, 4 keeps the
band ``[pos - pre_tokens, pos + next_tokens]`` around the right-down diagonal, 0 without a mask
keeps every key. Other layouts, modes and quantization raise ``NotImplementedError``.

Each documented precondition is a :class:`~sglang_fl.testing.doubles.Constraint` citing the
torch_npu API reference page (op-plugin ``docs/zh/custom_APIs/torch_npu/
torch_npu-npu_fused_infer_attention_score.md``, quoted), or, for ``_npu_reshape_and_cache``
(a private API without a reference page), the ATB ReshapeAndCache operation it runs and
op-plugin's ATB glue; what neither documents (an empty batch) is refused, being at least as
strict as the real operators.

The attention computation runs as a ``torch.library`` custom op with a fake implementation, as
``npu_fused_infer_attention_score`` is an operator (``torch.ops.npu``): its value-dependent work
(the block ids of ``block_table``, the mask's values) happens inside the kernel, never in the
caller's Python, so the conformance kit's host-read check sees what it would see on an NPU.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_fl.testing.doubles import Constraint, SdkDouble

FIA = "npu_fused_infer_attention_score"
FIA_DOC = "torch_npu API reference, torch_npu.npu_fused_infer_attention_score ({})"
RESHAPE = "_npu_reshape_and_cache"
ATB_RESHAPE = (
    "CANN ATB ReshapeAndCacheOperation (key [num_tokens, num_heads, head_size], key_cache "
    "[num_blocks, block_size, num_heads, head_size], slot_mapping int32 [num_tokens]; float16/"
    "bfloat16/int8), run by op-plugin's op_plugin/ops/atb/ReshapeAndCacheAtb.cpp"
)
UNDOCUMENTED = "not covered by the torch_npu API reference or the ATB operation's documentation"
HALF = (torch.float16, torch.bfloat16)
MASK_SIZE = 2048


class AttentionOperators(SdkDouble):
    """The attention operators of the ``torch_npu`` double."""

    # -- _npu_reshape_and_cache -------------------------------------------------------------
    RESHAPE_DTYPE = Constraint(
        RESHAPE,
        "float16/bfloat16 key, value and caches, key in key_cache's and value in value_cache's "
        "dtype",
        ATB_RESHAPE,
    )
    RESHAPE_SHAPES = Constraint(
        RESHAPE,
        "key [tokens, heads, dim] and value [tokens, heads, v_dim]; caches [blocks, block_size, "
        "heads, dim / v_dim] of one block count; int32 slot_indices [tokens]",
        ATB_RESHAPE,
    )
    RESHAPE_CONTIGUOUS = Constraint(
        RESHAPE,
        "contiguous key, value, caches and slot_indices",
        "op-plugin op_plugin/utils/custom_functions/atb/AtbCommon.cpp: ATB tensors are built "
        "from a tensor's data pointer and sizes, without strides (SGLang's NPU set_kv_buffer "
        "passes contiguous rows)",
        "reads and writes the wrong elements",
    )
    RESHAPE_SLOTS = Constraint(
        RESHAPE,
        "slots inside the caches (0 <= slot < blocks * block_size)",
        f"{ATB_RESHAPE}: block = slot // block_size, offset = slot % block_size, unchecked",
        "writes outside the caches",
    )
    RESHAPE_TOKENS = Constraint(RESHAPE, "at least one token", UNDOCUMENTED)

    # -- npu_fused_infer_attention_score ----------------------------------------------------
    FIA_DTYPE = Constraint(
        FIA,
        "float16/bfloat16 query, and key/value in the query's dtype",
        FIA_DOC.format(
            "query: 数据类型：torch.float16、torch.bfloat16 (Atlas A2/A3); key/value of the "
            "query's type (int8/int4 quantized modes aside)"
        ),
    )
    FIA_CONTIGUOUS = Constraint(
        FIA,
        "contiguous query, key and value",
        FIA_DOC.format("query/key/value: 不支持非连续Tensor"),
    )
    FIA_HEADS = Constraint(
        FIA,
        "num_heads and num_key_value_heads <= 256, num_heads divisible by num_key_value_heads "
        "with a ratio <= 64",
        FIA_DOC.format(
            "各轴取值范围: N (Q_N) ≤ 256, N (KV_N) ≤ 256; num_key_value_heads: num_heads能被"
            "num_key_value_heads整除，且比值 ≤ 64"
        ),
    )
    FIA_HEAD_DIM = Constraint(
        FIA,
        "head dim D <= 512, 16-byte aligned for float16/bfloat16",
        FIA_DOC.format("各轴取值范围: D ≤ 512, torch.float16/torch.bfloat16: 16字节对齐"),
    )
    FIA_PAGED = Constraint(
        FIA,
        "PageAttention: int32 block_table [B, max_blocks]; key/value [blocks, block_size, "
        "KV_N * D] with the query in BSH (or TND, as SGLang's extend passes it)",
        FIA_DOC.format(
            "block_table: torch.int32, 必须为二维 [B, maxBlockNumPerSeq]; 示例2: kv cache为BnBsH"
            "时必须用BSH"
        )
        + "; SGLang 0.5.23 hardware_backend/npu/attention/ascend_backend.py forward_extend "
        "(input_layout='TND' over the same view)",
    )
    FIA_BLOCK_SIZE = Constraint(
        FIA,
        "block_size: with one query token per request 1..512 and 16-aligned; otherwise "
        "128..512 in multiples of 128",
        FIA_DOC.format(
            "block_size: Q_S > 1：最小128，最大512，须为128倍数。 Q_S = 1： 非0值，最大512。"
            "torch.float16/torch.bfloat16需16字节对齐"
        ),
    )
    FIA_SEQ_KV = Constraint(
        FIA,
        "actual_seq_lengths_kv given with PageAttention, one length per request, each within "
        "its block_table row, whose block ids lie inside key/value",
        FIA_DOC.format(
            "actual_seq_lengths_kv: PageAttention场景下必须传入; 传入值 ≤ 对应KV_S; block_table: "
            "blockid合法性由用户保证"
        ),
        "reads outside the cache (block ids are not checked)",
    )
    FIA_TND = Constraint(
        FIA,
        "TND: actual_seq_lengths given, non-decreasing cumulative sums ending at T, at most 4096",
        FIA_DOC.format(
            "actual_seq_lengths: TND布局时必须传入：每个元素值为当前batch与之前所有batch的seqlen"
            "累加和（后值 ≥ 前值，非负），元素个数即batch值（≤ 4096）"
        ),
    )
    FIA_MASK = Constraint(
        FIA,
        "sparse_mode 3 or 4 with a bool (2048, 2048) atten_mask, True above the diagonal",
        FIA_DOC.format(
            "atten_mask: sparse_mode=2/3/4时：shape必须为(2048, 2048)或(1, 2048, 2048)或"
            "(1, 1, 2048, 2048)，需用户保证为下三角"
        )
        + "; SGLang's generate_mask_flag: ~tril(ones(2048, 2048))",
    )
    FIA_BATCH = Constraint(
        FIA,
        "1 <= B <= 65536 requests and at least one query token",
        FIA_DOC.format("各轴取值范围: B ≤ 65536") + f"; an empty batch is {UNDOCUMENTED}",
    )

    def _npu_reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_indices: torch.Tensor,
    ) -> None:
        self.record(RESHAPE, key, value, key_cache, value_cache, slot_indices)
        tensors = (key, value, key_cache, value_cache)
        self.RESHAPE_DTYPE.check(
            all(t.dtype in HALF for t in tensors)
            and key.dtype == key_cache.dtype
            and value.dtype == value_cache.dtype,
            ", ".join(str(t.dtype) for t in tensors),
        )
        tokens = key.shape[0]
        self.RESHAPE_SHAPES.check(
            key.dim() == 3
            and value.dim() == 3
            and key_cache.dim() == 4
            and value_cache.dim() == 4
            and key_cache.shape[:3] == value_cache.shape[:3]
            and value.shape[:2] == key.shape[:2]
            and key_cache.shape[2:] == key.shape[1:]
            and value_cache.shape[2:] == value.shape[1:]
            and slot_indices.dtype == torch.int32
            and tuple(slot_indices.shape) == (tokens,),
            f"key {tuple(key.shape)}, value {tuple(value.shape)}, caches "
            f"{tuple(key_cache.shape)}/{tuple(value_cache.shape)}, slots {slot_indices.dtype} "
            f"{tuple(slot_indices.shape)}",
        )
        self.RESHAPE_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (*tensors, slot_indices)),
            ", ".join(str(t.stride()) for t in tensors),
        )
        self.RESHAPE_TOKENS.check(tokens > 0, "0 tokens")
        capacity = key_cache.shape[0] * key_cache.shape[1]
        slots = slot_indices.long()
        self.RESHAPE_SLOTS.check(
            bool(((slots >= 0) & (slots < capacity)).all()), f"capacity {capacity}"
        )
        key_cache.view(capacity, *key_cache.shape[2:])[slots] = key
        value_cache.view(capacity, *value_cache.shape[2:])[slots] = value

    def npu_fused_infer_attention_score(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        atten_mask: torch.Tensor | None = None,
        actual_seq_lengths: list[int] | None = None,
        actual_seq_lengths_kv: list[int] | None = None,
        block_table: torch.Tensor | None = None,
        num_heads: int = 1,
        scale: float = 1.0,
        pre_tokens: int = 2147483647,
        next_tokens: int = 2147483647,
        input_layout: str = "BSH",
        num_key_value_heads: int = 0,
        sparse_mode: int = 0,
        block_size: int = 0,
        **options: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.record(
            FIA,
            query,
            key,
            value,
            atten_mask=atten_mask,
            actual_seq_lengths=actual_seq_lengths,
            actual_seq_lengths_kv=actual_seq_lengths_kv,
            block_table=block_table,
            num_heads=num_heads,
            scale=scale,
            pre_tokens=pre_tokens,
            next_tokens=next_tokens,
            input_layout=input_layout,
            num_key_value_heads=num_key_value_heads,
            sparse_mode=sparse_mode,
            block_size=block_size,
        )
        _unmodeled(not options, f"options {sorted(options)}")
        _unmodeled(block_table is not None, "attention without PageAttention")
        _unmodeled(input_layout in ("BSH", "TND"), f"input_layout {input_layout!r}")
        _unmodeled(sparse_mode in (0, 3, 4), f"sparse_mode {sparse_mode}")
        assert block_table is not None  # for the type checker: _unmodeled refused None
        self.FIA_DTYPE.check(
            query.dtype in HALF and key.dtype == query.dtype and value.dtype == query.dtype,
            f"query {query.dtype}, key {key.dtype}, value {value.dtype}",
        )
        self.FIA_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (query, key, value)),
            f"strides {query.stride()}, {key.stride()}, {value.stride()}",
        )
        kv_heads = num_key_value_heads or num_heads
        self.FIA_HEADS.check(
            num_heads <= 256
            and kv_heads <= 256
            and num_heads % kv_heads == 0
            and num_heads // kv_heads <= 64,
            f"{num_heads}/{kv_heads}",
        )
        hidden = query.shape[-1] if input_layout == "BSH" else query.shape[-1] * num_heads
        d = hidden // num_heads
        self.FIA_HEAD_DIM.check(
            hidden % num_heads == 0 and d <= 512 and d * query.dtype.itemsize % 16 == 0, str(d)
        )
        tnd = input_layout == "TND"
        batch = block_table.shape[0]
        self.FIA_PAGED.check(
            block_table.dtype == torch.int32
            and block_table.dim() == 2
            and key.dim() == 3
            and value.dim() == 3
            and key.shape == value.shape
            and key.shape[1] == block_size
            and key.shape[2] == kv_heads * d
            and (query.dim() == 3 if tnd else query.dim() == 3 and query.shape[0] == batch)
            and (not tnd or query.shape[1] == num_heads),
            f"block_table {block_table.dtype} {tuple(block_table.shape)}, key "
            f"{tuple(key.shape)}, query {tuple(query.shape)} ({input_layout})",
        )
        self.FIA_BATCH.check(
            0 < batch <= 65536 and query.shape[0] > 0, f"B {batch}, query {tuple(query.shape)}"
        )
        one_token = not tnd and query.shape[1] == 1  # BSH: (B, Q_S, H)
        self.FIA_BLOCK_SIZE.check(
            (0 < block_size <= 512 and block_size % 16 == 0)
            if one_token
            else (128 <= block_size <= 512 and block_size % 128 == 0),
            f"block_size {block_size}, {'one' if one_token else 'several'} query tokens",
        )
        lens_kv = actual_seq_lengths_kv
        self.FIA_SEQ_KV.check(  # the block ids: inside the kernel (_paged_attention)
            lens_kv is not None
            and len(lens_kv) == batch
            and all(0 <= n <= block_table.shape[1] * block_size for n in lens_kv),
            f"{lens_kv} over block_table {tuple(block_table.shape)}",
        )
        assert lens_kv is not None
        if tnd:
            cums = actual_seq_lengths
            self.FIA_TND.check(
                cums is not None
                and len(cums) == batch <= 4096
                and all(b >= a for a, b in zip([0, *cums], cums, strict=False))
                and cums[-1] == query.shape[0],
                f"{cums} for {query.shape[0]} tokens",
            )
            assert cums is not None
            starts = [0, *cums]
        else:
            starts = list(range(batch + 1))
        masked = sparse_mode in (3, 4)
        if masked:  # its values: inside the kernel (_paged_attention)
            self.FIA_MASK.check(
                atten_mask is not None
                and atten_mask.dtype == torch.bool
                and tuple(atten_mask.shape) == (MASK_SIZE, MASK_SIZE),
                "no mask"
                if atten_mask is None
                else f"{atten_mask.dtype} {tuple(atten_mask.shape)}",
            )
        # One query token (the IncreFlashAttention branch): sparse_mode has no effect.
        band = (pre_tokens, 0 if sparse_mode == 3 else next_tokens)
        out = torch.ops.sglang_fl_test.npu_paged_attention(
            query.reshape(-1, num_heads, d), key, value, block_table, lens_kv, starts,
            kv_heads, block_size, scale, band[0], band[1],
            atten_mask if masked else None, bool(sparse_mode) and not one_token,
        )  # fmt: skip
        return out.view(query.shape), query.new_zeros(1)


@torch.library.custom_op("sglang_fl_test::npu_paged_attention", mutates_args=())
def _paged_attention(
    rows: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_table: torch.Tensor,
    lens_kv: list[int],
    starts: list[int],
    kv_heads: int,
    block_size: int,
    scale: float,
    pre_tokens: int,
    next_tokens: int,
    atten_mask: torch.Tensor | None,
    banded: bool,
) -> torch.Tensor:
    """The kernel: reads the block ids (inside key/value) and the mask, attends per request."""
    AttentionOperators.FIA_SEQ_KV.check(
        all(
            0 <= int(block) < key.shape[0]
            for b, n in enumerate(lens_kv)
            for block in block_table[b, : -(-n // block_size)].tolist()
        ),
        f"block ids {block_table.tolist()} for {key.shape[0]} blocks",
    )
    if atten_mask is not None:
        expected = ~torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool).tril()
        AttentionOperators.FIA_MASK.check(
            torch.equal(atten_mask.cpu(), expected), "a mask of other values"
        )
    d = rows.shape[-1]
    out = torch.empty_like(rows)
    for b, length in enumerate(lens_kv):
        blocks = block_table[b, : -(-length // block_size)].long()
        keys = key[blocks].reshape(-1, kv_heads, d)[:length]
        values = value[blocks].reshape(-1, kv_heads, d)[:length]
        span = slice(starts[b], starts[b + 1])
        band = (pre_tokens, next_tokens) if banded else None
        out[span] = _attend(rows[span], keys, values, scale, band)
    return out


@_paged_attention.register_fake
def _(rows: torch.Tensor, *rest: object) -> torch.Tensor:
    return torch.empty_like(rows)


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    band: tuple[int, int] | None,
) -> torch.Tensor:
    """One request in float32: row ``i`` at position ``i + k_len - q_len`` (right-down); with a
    band it sees keys ``[pos - band[0], pos + band[1]]``, without one every key."""
    q_len, heads = q.shape[0], q.shape[1]
    k_len, kv_heads = keys.shape[0], keys.shape[1]
    k = keys.float().repeat_interleave(heads // kv_heads, dim=1)
    v = values.float().repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if band is not None:
        pos = torch.arange(q_len).unsqueeze(1) + (k_len - q_len)
        key = torch.arange(k_len).unsqueeze(0)
        allowed = (key >= pos - band[0]) & (key <= pos + band[1])
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def _unmodeled(holds: bool, what: str) -> None:
    """Refuse a call the double does not compute (the real operator may accept it)."""
    if not holds:
        raise NotImplementedError(f"the test double does not model {what}")
