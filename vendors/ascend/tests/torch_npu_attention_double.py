"""TEST DOUBLE of torch_npu's attention operators (part of ``TorchNpuDouble``), on the CPU.

``_npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)`` -> ``None``
(writes the caches in place), ``_npu_paged_attention(query, key_cache, value_cache,
num_kv_heads, num_heads, scale_value, block_table, context_lens, out)`` -> ``None`` (writes
``out``) and ``npu_fused_infer_attention_score(query, key, value, *, ...)`` ->
``(attention_out, softmax_lse)`` in the forms SGLang's Ascend backend calls: PageAttention
decode in ``BSH``, PageAttention extend in ``TND`` and, per request, in ``BSND``. The math is
the API reference's: ``softmax(scale * q k^T + mask) v`` over the keys each request's
``block_table`` row and ``actual_seq_lengths_kv`` select; ``sparse_mode`` 3 masks right-down
causally, 4 keeps the band ``[pos - pre_tokens, pos + next_tokens]`` around the right-down
diagonal, 0 keeps every key (less those a one-token ``(B, KV_S)`` mask marks). Other layouts,
modes and quantization raise ``NotImplementedError``.

Each documented precondition is a :class:`~sglang_fl.testing.doubles.Constraint` citing its
page: the op-plugin API page ``docs/zh/custom_APIs/torch_npu/
torch_npu-npu_fused_infer_attention_score.md`` (quoted), for the two ATB operations (private
APIs without a torch_npu page) the ATB operation pages and op-plugin's ATB glue and docstrings
(``op_plugin/python/atb/_atb_api_docs.py``); what none documents (an empty batch) is refused,
being at least as strict as the real operators. Soc-dependent rules read the emulated SoC
(``soc_version`` of ``TorchNpuDouble``).

Each operator's work runs as a ``torch.library`` custom op with a fake implementation, as the
real ones are operators (``torch.ops.npu``, ATB operations): everything that reads a tensor's
values (slot and block ids, ``context_lens``, the masks' values) happens inside that kernel,
never in the caller's Python, so the conformance kit's host-read check (which reruns a planned
call on fake tensors) sees what it would see on an NPU. The checks of shapes, dtypes, strides
and host lists stay in the operator's Python entry, before the kernel.
"""

from __future__ import annotations

import re
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
PAGED = "_npu_paged_attention"
ATB_PAGED = (
    "op-plugin op_plugin/python/atb/_atb_api_docs.py, _npu_paged_attention_v2 规格约束 (the same "
    "ATB PagedAttentionOperation op_plugin/ops/atb/PagedAttentionAtb.cpp runs for "
    "_npu_paged_attention, maskType UNDEFINED, inputLayout TYPE_BSND)"
)
ATB_PAGED_IO = (
    "CANN ATB PagedAttentionOperation, 输入输出列表 (ascendtb_01_0206, CANN 8.2.RC1): query "
    "[num_tokens, num_head, head_size] float16/bf16, blockTables int32 npu, contextLens "
    "[batch] int32 cpu"
)
UNDOCUMENTED = "not covered by the torch_npu API reference or the ATB operation's documentation"
HALF = (torch.float16, torch.bfloat16)
MASK_SIZE = 2048
# Atlas A2 (220-225) and A3 (250-255) SoC versions: ND paged caches (vllm_ascend/utils.py ranges).
A2_A3 = (*range(220, 226), *range(250, 256))
# TND with PageAttention from the op-plugin 7.3.0 pages on (the 7.1.0/7.2.0 pages' TND with
# query D != 512: '不支持左padding、tensorlist、pse、page attention、...'): the first torch_npu
# build of each line that Ascend Extension for PyTorch 7.3.0 made (Ascend/pytorch tags
# v7.3.0-pytorch2.x, version.txt); lines from 2.9.0 on were first built by 7.3.0.
TND_PAGED_FIRST_POST = {"2.6.0": 5, "2.7.1": 2, "2.8.0": 2}


def tnd_takes_page_attention(version: str) -> bool:
    """Whether torch_npu ``version`` is a 7.3.0 build or later (TND with PageAttention)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version)
    if match is None:
        return False
    release = (int(match[1]), int(match[2]), int(match[3]))
    first = TND_PAGED_FIRST_POST.get(".".join(match.group(1, 2, 3)))
    return release >= (2, 9, 0) or (first is not None and int(match[4] or 0) >= first)


# FIA's TND without rope on Atlas A2/A3: (Q/K head dim, V head dim).
TND_HEAD_DIMS = ((128, 128), (192, 128), (192, 192))


class AttentionOperators(SdkDouble):
    """The attention operators of the ``torch_npu`` double."""

    # -- _npu_reshape_and_cache -------------------------------------------------------------
    RESHAPE_DTYPE = Constraint(
        RESHAPE,
        "float16/bfloat16 key, value and caches, all of one dtype",
        f"{ATB_RESHAPE}; ATB ReshapeAndCacheOperation 约束 (ascendtb_01_0073, CANN 8.0.RC2.2): "
        "'key、value、keyCache、valueCache...的数据类型都必须完全一致'",
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
        "distinct slots inside the caches (0 <= slot < blocks * block_size)",
        f"{ATB_RESHAPE}: block = slot // block_size, offset = slot % block_size, unchecked; "
        "ATB ReshapeAndCacheOperation (ascendtb_01_0089, CANN 8.0.RC3): slotMapping "
        "'不存在重复数值'",
        "writes outside the caches",
    )
    RESHAPE_TOKENS = Constraint(RESHAPE, "at least one token", UNDOCUMENTED)

    # -- _npu_paged_attention ----------------------------------------------------------------
    PAGED_DTYPE = Constraint(
        PAGED,
        "float16/bfloat16 query, caches and out of one dtype",
        f"{ATB_PAGED}: query/key_cache/value_cache float16/bf16 (int8 quantized aside), out "
        "float16/bf16",
    )
    PAGED_SHAPES = Constraint(
        PAGED,
        "query [tokens, num_heads, head_size]; ND caches [blocks, block_size, num_kv_heads, "
        "head_size_k / head_size_v] on Atlas A2/A3; int32 block_table [tokens, max_blocks]; "
        "int32 host context_lens [tokens]; out [tokens, num_heads, head_size_v]; num_heads a "
        "multiple of num_kv_heads",
        f"{ATB_PAGED}; {ATB_PAGED_IO}; Atlas 推理系列产品 take NZ caches instead",
    )
    PAGED_BLOCK_SIZE = Constraint(
        PAGED,
        "block_size % 16 == 0 and <= 128; head sizes in (0, 576]",
        f"{ATB_PAGED}: '因硬件限制，block_size %16 == 0', 'block_size <= 128'; "
        "key_cache/value_cache "
        "head_size (0, 576] (may differ)",
    )
    PAGED_CONTIGUOUS = Constraint(
        PAGED,
        "contiguous query, caches, block_table and out",
        "op-plugin op_plugin/utils/custom_functions/atb/AtbCommon.cpp: ATB tensors are built "
        "from a tensor's data pointer and sizes, without strides",
        "reads and writes the wrong elements",
    )
    PAGED_LENGTHS = Constraint(
        PAGED,
        "context_lens within each block_table row, whose block ids lie in [0, num_blocks)",
        f"{ATB_PAGED}: 'block_tables中元素的值须在[0, num_blocks)之间'",
        "reads outside the cache",
    )
    PAGED_BATCH = Constraint(PAGED, "at least one query token", UNDOCUMENTED)

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
        "KV_N * D] (BnBsH) with the query in BSH (B, Q_S, H), BSND (B, Q_S, N, D) or TND "
        "(T, N, D)",
        FIA_DOC.format(
            "block_table: torch.int32, 必须为二维 [B, maxBlockNumPerSeq]; PageAttention约束: kv "
            "cache排布 BSH/BSND仅BnBsH，BNSD/TND支持BnBsH和BnNBsD; input_layout table"
        ),
    )
    FIA_KV_SHAPE = Constraint(
        FIA,
        "key and value of one shape (outside TND's Q/K 192 with V 128)",
        FIA_DOC.format("通用基础约束: key与value的shape必须完全一致; TND布局约束 for V_D != K_D"),
    )
    FIA_BLOCK_SIZE = Constraint(
        FIA,
        "block_size: with one query token a non-zero multiple of 16 up to 512 (float16/"
        "bfloat16 K/V); otherwise 128..512 in multiples of 128, but in TND multiples of 16 up "
        "to 1024",
        FIA_DOC.format(
            "PageAttention约束: block_size Q_S > 1 最小128，最大512，须128倍数; "
            "Q_S = 1 非0，最大512，float16/bfloat16需16字节对齐; "
            "TND布局约束 (query D != 512): PageAttention仅block_size须为16的倍数且 ≤ 1024"
        )
        + "; op-plugin 26.0.0 docs/en page, When Q_S is equal to 1, Page attention scenarios: "
        "'When the input data types of key and value are float16 or bfloat16, the block_size "
        "must be a multiple of 16' (the same in the 7.3.0 and 26.1.0 pages)",
    )
    FIA_TND_PAGED = Constraint(
        FIA,
        "TND with PageAttention only from an Ascend Extension for PyTorch 7.3.0 build "
        "(2.6.0.post5, 2.7.1.post2, 2.8.0.post2, 2.9.0 and later)",
        "op-plugin 7.1.0/7.2.0 docs/context/torch_npu-npu_fused_infer_attention_score.md, TND "
        "with query D != 512: '不支持左padding、tensorlist、pse、page attention、prefix、...'; the "
        "7.3.0 page: 'page attention场景下仅支持blocksize为16对齐且小于等于1024'; Ascend/pytorch "
        "tags v7.3.0-pytorch2.x (version.txt)",
    )
    FIA_TND_HEAD_DIM = Constraint(
        FIA,
        "TND without rope: Q/K/V head dims 128, or Q/K 192 with V 128 or 192",
        FIA_DOC.format(
            "TND布局约束, query D ≠ 512, 无rope: Q_D、K_D、V_D = 128，"
            "或Q_D、K_D = 192且V_D = 128或192"
        ),
    )
    FIA_ONE_TOKEN_MASK = Constraint(
        FIA,
        "sparse_mode 0 with a mask only at one query token (BSH/BSND): bool/int8/uint8 "
        "(B, KV_S) with KV_S >= block_table columns x block_size",
        FIA_DOC.format(
            "atten_mask: 当input_layout为BSH/BSND/BNSD/BNSD_BSND且不传rope时，Q_S=1支持(B, KV_S); "
            "PageAttention约束: Q_S = 1时开启atten_mask（sparse_mode非2/3/4）："
            "atten_mask最后一维 ≥ "
            "block_table第二维 × block_size"
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
            key.dtype in HALF and all(t.dtype == key.dtype for t in tensors),
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
        torch.ops.sglang_fl_test.reshape_and_cache(key, value, key_cache, value_cache, slot_indices)

    def _npu_paged_attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        num_kv_heads: int,
        num_heads: int,
        scale_value: float,
        block_table: torch.Tensor,
        context_lens: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        self.record(
            PAGED,
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            num_kv_heads=num_kv_heads,
            num_heads=num_heads,
            scale_value=scale_value,
            block_table=block_table,
            context_lens=context_lens,
            out=out,
        )
        tensors = (query, key_cache, value_cache, out)
        self.PAGED_DTYPE.check(
            query.dtype in HALF and all(t.dtype == query.dtype for t in tensors),
            ", ".join(str(t.dtype) for t in tensors),
        )
        tokens = query.shape[0]
        self.PAGED_SHAPES.check(
            getattr(self, "soc_version", None) in A2_A3
            and query.dim() == 3
            and query.shape[1] == num_heads
            and key_cache.dim() == value_cache.dim() == 4
            and key_cache.shape[:3] == value_cache.shape[:3]
            and key_cache.shape[2] == num_kv_heads
            and key_cache.shape[3] == query.shape[2]
            and num_heads % num_kv_heads == 0
            and block_table.dtype == torch.int32
            and block_table.dim() == 2
            and block_table.shape[0] == tokens
            and context_lens.dtype == torch.int32
            and context_lens.device.type == "cpu"
            and tuple(context_lens.shape) == (tokens,)
            and tuple(out.shape) == (tokens, num_heads, value_cache.shape[3]),
            f"SoC {getattr(self, 'soc_version', None)}, query {tuple(query.shape)}, caches "
            f"{tuple(key_cache.shape)}/{tuple(value_cache.shape)}, block_table "
            f"{block_table.dtype} {tuple(block_table.shape)}, context_lens "
            f"{context_lens.dtype} on {context_lens.device}, out {tuple(out.shape)}",
        )
        block_size, d, dv = key_cache.shape[1], key_cache.shape[3], value_cache.shape[3]
        self.PAGED_BLOCK_SIZE.check(
            block_size % 16 == 0 and 0 < block_size <= 128 and 0 < d <= 576 and 0 < dv <= 576,
            f"block_size {block_size}, head sizes {d}/{dv}",
        )
        self.PAGED_CONTIGUOUS.check(
            all(t.is_contiguous() for t in (*tensors, block_table)),
            ", ".join(str(t.stride()) for t in tensors),
        )
        self.PAGED_BATCH.check(tokens > 0, "0 tokens")
        torch.ops.sglang_fl_test.paged_attention(
            query, key_cache, value_cache, scale_value, block_table, context_lens, out
        )

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
        _unmodeled(input_layout in ("BSH", "BSND", "TND"), f"input_layout {input_layout!r}")
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
        tnd = input_layout == "TND"
        hidden = query.shape[-1] if input_layout == "BSH" else query.shape[-1] * num_heads
        d = hidden // num_heads
        self.FIA_HEAD_DIM.check(
            hidden % num_heads == 0 and d <= 512 and d * query.dtype.itemsize % 16 == 0, str(d)
        )
        batch = block_table.shape[0]
        dims = {"BSH": 3, "BSND": 4, "TND": 3}[input_layout]
        self.FIA_PAGED.check(
            block_table.dtype == torch.int32
            and block_table.dim() == 2
            and key.dim() == 3
            and value.dim() == 3
            and key.shape[:2] == value.shape[:2]
            and key.shape[1] == block_size
            and key.shape[2] == kv_heads * d
            and value.shape[2] % kv_heads == 0
            and query.dim() == dims
            and (tnd or query.shape[0] == batch)
            and (input_layout == "BSH" or query.shape[-2] == num_heads),
            f"block_table {block_table.dtype} {tuple(block_table.shape)}, key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}, query {tuple(query.shape)} "
            f"({input_layout})",
        )
        dv = value.shape[2] // kv_heads
        if tnd:
            version = str(self.__version__)
            self.FIA_TND_PAGED.check(tnd_takes_page_attention(version), f"torch_npu {version}")
            self.FIA_TND_HEAD_DIM.check((d, dv) in TND_HEAD_DIMS, f"{d}/{dv}")
        else:
            self.FIA_KV_SHAPE.check(key.shape == value.shape, f"{key.shape} and {value.shape}")
        self.FIA_BATCH.check(
            0 < batch <= 65536 and query.shape[0] > 0, f"B {batch}, query {tuple(query.shape)}"
        )
        one_token = not tnd and query.shape[1] == 1  # BSH/BSND: (B, Q_S, ...)
        if tnd:
            block_ok = block_size % 16 == 0 and 0 < block_size <= 1024
        elif one_token:
            block_ok = block_size % 16 == 0 and 0 < block_size <= 512
        else:
            block_ok = 128 <= block_size <= 512 and block_size % 128 == 0
        self.FIA_BLOCK_SIZE.check(
            block_ok,
            f"block_size {block_size}, {input_layout}, "
            f"{'one' if one_token else 'several'} query tokens",
        )
        lens_kv = actual_seq_lengths_kv
        self.FIA_SEQ_KV.check(  # the block ids: inside the kernel (_fused_attention)
            lens_kv is not None
            and len(lens_kv) == batch
            and _within(block_table, lens_kv, block_size),
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
            q_len = query.shape[1]
            starts = [b * q_len for b in range(batch + 1)]
        if sparse_mode in (3, 4):  # the mask's values: inside the kernel (_fused_attention)
            self.FIA_MASK.check(
                atten_mask is not None
                and atten_mask.dtype == torch.bool
                and tuple(atten_mask.shape) == (MASK_SIZE, MASK_SIZE),
                "no mask"
                if atten_mask is None
                else f"{atten_mask.dtype} {tuple(atten_mask.shape)}",
            )
        elif atten_mask is not None:
            self.FIA_ONE_TOKEN_MASK.check(
                one_token
                and atten_mask.dtype in (torch.bool, torch.int8, torch.uint8)
                and atten_mask.dim() == 2
                and atten_mask.shape[0] == batch
                and atten_mask.shape[1] >= block_table.shape[1] * block_size,
                f"{atten_mask.dtype} {tuple(atten_mask.shape)}, {query.shape[1]} query tokens",
            )
        # One query token (the IncreFlashAttention branch): sparse_mode has no effect.
        band = (pre_tokens, 0 if sparse_mode == 3 else next_tokens)
        out = torch.ops.sglang_fl_test.fused_attention(
            query.reshape(-1, num_heads, d), key, value, block_table, lens_kv, starts, dv,
            scale, band[0], band[1], atten_mask, sparse_mode in (3, 4), not one_token,
        )  # fmt: skip
        shape = (
            (*query.shape[:-1], num_heads * dv)
            if input_layout == "BSH"
            else (*query.shape[:-1], dv)
        )
        return out.view(shape), query.new_zeros(1)


def _within(table: torch.Tensor, lengths: list[int], block_size: int) -> bool:
    """Whether each request's tokens fit its ``table`` row (host values and shapes only)."""
    return all(0 <= n <= table.shape[1] * block_size for n in lengths)


def _inside(table: torch.Tensor, lengths: list[int], block_size: int, blocks: int) -> bool:
    """Whether each request's tokens fit its ``table`` row and the blocks they use exist
    (reads the block ids: called inside a kernel only)."""
    return _within(table, lengths, block_size) and all(
        0 <= int(block) < blocks
        for b, n in enumerate(lengths)
        for block in table[b, : -(-n // block_size)].tolist()
    )


def _gather(
    cache: torch.Tensor, table: torch.Tensor, b: int, n: int, block_size: int, heads: int
) -> torch.Tensor:
    """Request ``b``'s first ``n`` tokens of a paged ``cache`` as ``[n, heads, dim]``."""
    blocks = table[b, : -(-n // block_size)].long()
    return cache[blocks].reshape(-1, heads, cache.shape[-1] // heads)[:n]


# -- the kernels: what reads values, as custom ops with fake implementations ---------------------


@torch.library.custom_op(
    "sglang_fl_test::reshape_and_cache", mutates_args=("key_cache", "value_cache")
)
def _reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    """ReshapeAndCache's kernel: reads the slot ids, writes the rows there."""
    capacity = key_cache.shape[0] * key_cache.shape[1]
    slots = slot_indices.long()
    AttentionOperators.RESHAPE_SLOTS.check(
        bool(((slots >= 0) & (slots < capacity)).all()) and slots.unique().numel() == slots.numel(),
        f"{slots.tolist()} in capacity {capacity}",
    )
    key_cache.view(capacity, *key_cache.shape[2:])[slots] = key
    value_cache.view(capacity, *value_cache.shape[2:])[slots] = value


@_reshape_and_cache.register_fake
def _(*_: object) -> None:
    return None


@torch.library.custom_op("sglang_fl_test::paged_attention", mutates_args=("out",))
def _paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    scale: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """ATB PagedAttention's kernel: reads ``context_lens`` and the block ids, writes ``out``."""
    lengths = context_lens.tolist()
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    AttentionOperators.PAGED_LENGTHS.check(
        all(n > 0 for n in lengths)
        and _inside(block_table, lengths, block_size, key_cache.shape[0]),
        f"{lengths} over block_table {block_table.tolist()} of {key_cache.shape[0]} blocks",
    )
    for b, n in enumerate(lengths):
        keys = _gather(key_cache.flatten(2), block_table, b, n, block_size, kv_heads)
        values = _gather(value_cache.flatten(2), block_table, b, n, block_size, kv_heads)
        out[b] = _attend(query[b : b + 1], keys, values, scale, None)[0]


@_paged_attention.register_fake
def _(*_: object) -> None:
    return None


@torch.library.custom_op("sglang_fl_test::fused_attention", mutates_args=())
def _fused_attention(
    rows: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_table: torch.Tensor,
    lens_kv: list[int],
    starts: list[int],
    dv: int,
    scale: float,
    pre_tokens: int,
    next_tokens: int,
    atten_mask: torch.Tensor | None,
    band_mode: bool,
    several_tokens: bool,
) -> torch.Tensor:
    """FIA's kernel: reads the block ids and the mask's values, attends per request.

    ``band_mode``: sparse_mode 3/4, whose ``atten_mask`` is the (2048, 2048) causal one and
    whose band applies with several query tokens only; otherwise an ``atten_mask`` is the
    one-token ``(B, KV_S)`` mask of the keys each request's token does not see.
    """
    block_size, num_heads = key.shape[1], rows.shape[1]
    kv_heads = value.shape[2] // dv
    AttentionOperators.FIA_SEQ_KV.check(
        _inside(block_table, lens_kv, block_size, key.shape[0]),
        f"block ids {block_table.tolist()} for {key.shape[0]} blocks",
    )
    keep: torch.Tensor | None = None
    if band_mode:
        expected = ~torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool).tril()
        assert atten_mask is not None  # checked by the operator's entry
        AttentionOperators.FIA_MASK.check(
            torch.equal(atten_mask.cpu(), expected), "a mask of other values"
        )
    elif atten_mask is not None:
        keep = ~atten_mask.bool()
    out = rows.new_empty((rows.shape[0], num_heads, dv))
    for b, length in enumerate(lens_kv):
        keys = _gather(key, block_table, b, length, block_size, kv_heads)
        values = _gather(value, block_table, b, length, block_size, kv_heads)
        span = slice(starts[b], starts[b + 1])
        if keep is not None:  # the one query token sees the keys its mask row leaves
            kept = keep[b, :length]
            keys, values = keys[kept], values[kept]
        band = (pre_tokens, next_tokens) if band_mode and several_tokens else None
        out[span] = _attend(rows[span], keys, values, scale, band)
    return out


@_fused_attention.register_fake
def _(rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *rest: Any) -> torch.Tensor:
    dv = rest[3]
    return rows.new_empty((rows.shape[0], rows.shape[1], dv))


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
