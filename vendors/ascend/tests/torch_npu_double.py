"""A TEST DOUBLE of ``torch_npu``: its documented operator semantics in PyTorch, on the CPU.

Not the real SDK (which must never be installed here: without CANN it breaks ``import torch``).
It stands in for ``torch_npu`` in ``sys.modules`` with the operators SGLang's ``forward_npu``
methods call, their argument order and return tuples (torch_npu / CANN operator docs):
``npu_swiglu``, ``npu_rms_norm`` -> ``(y, rstd)``, ``npu_add_rms_norm`` -> ``(y, rstd, x1 + x2)``,
``npu_mrope`` -> ``(query, key)``, the MoE operators (``npu_moe_gating_top_k(_softmax)``,
``npu_moe_init_routing_v2``, ``npu_grouped_matmul``, ``npu_moe_finalize_routing``), and
``npu.device_count()``. Every operator returns new
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

    # --- MoE: torch_npu / CANN operator docs; how SGLang 0.5.23 calls them is in
    # sglang/srt/hardware_backend/npu/moe/{topk,init_routing,matmul,finalize_routing}.py

    def npu_moe_gating_top_k_softmax(
        self, x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(y, expert_idx, row_idx)``: top-k of softmax(x), ``y`` in x's dtype, int32 ids."""
        self.calls.append(("npu_moe_gating_top_k_softmax", (x,), {"finished": finished, "k": k}))
        assert x.dim() in (2, 3), "x is 2-D or 3-D"
        assert x.dtype in FLOATS
        assert finished is None, "the double models the call without a finished mask"
        assert 0 < k <= x.shape[-1], "0 < k <= experts"
        assert x.shape[0] > 0, "the double refuses an empty launch the docs do not cover"
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """aclnnMoeGatingTopK: norm, + bias for the choice, groups, top-k, y / (sum + eps) * f."""
        self.calls.append(
            (
                "npu_moe_gating_top_k",
                (x, k),
                {
                    "bias": bias,
                    "k_group": k_group,
                    "group_count": group_count,
                    "group_select_mode": group_select_mode,
                    "renorm": renorm,
                    "norm_type": norm_type,
                    "out_flag": out_flag,
                    "routed_scaling_factor": routed_scaling_factor,
                    "eps": eps,
                },
            )
        )
        assert x.dim() == 2, "x is 2-D"
        assert x.dtype in FLOATS
        tokens, experts = x.shape
        assert tokens > 0, "the double refuses an empty launch the docs do not cover"
        assert experts <= 2048, "at most 2048 experts"
        assert experts % group_count == 0, "experts divisible by group_count"
        assert 1 <= k_group <= group_count
        assert 1 <= k <= experts // group_count * k_group, "1 <= k <= E / group_count * k_group"
        assert bias is None or (bias.shape == (experts,) and bias.dtype == x.dtype)
        assert group_select_mode in (0, 1)
        assert norm_type in (0, 1), "0 softmax, 1 sigmoid"
        assert renorm == 0, "norm first, then top-k: the documented mode"
        assert not out_flag
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
        y = y / (y.sum(dim=-1, keepdim=True) + eps) * routed_scaling_factor
        return y.to(x.dtype), ids.to(torch.int32), None

    def npu_moe_init_routing_v2(
        self,
        x: torch.Tensor,
        expert_idx: torch.Tensor,
        *,
        active_num: int,
        expert_num: int,
        expert_tokens_num_type: int,
        expert_tokens_num_flag: bool,
        active_expert_range: list[int],
        quant_mode: int,  # no default here: its default differs across torch_npu branches
        scale: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
        expert_capacity: int = -1,
        drop_pad_mode: int = 0,
        row_idx_type: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rows of ``x`` sorted by expert (stable), where each source row (token-major flat
        index ``t * k + j``) went, and per-expert counts."""
        self.calls.append(
            (
                "npu_moe_init_routing_v2",
                (x, expert_idx),
                {
                    "active_num": active_num,
                    "expert_num": expert_num,
                    "expert_tokens_num_type": expert_tokens_num_type,
                    "expert_tokens_num_flag": expert_tokens_num_flag,
                    "active_expert_range": active_expert_range,
                    "quant_mode": quant_mode,
                },
            )
        )
        assert x.dim() == 2
        assert x.dtype in FLOATS
        assert expert_idx.dtype == torch.int32, "expert_idx is int32"
        assert expert_idx.shape[0] == x.shape[0]
        assert quant_mode == -1, "the double models the unquantized mode"
        assert scale is None
        assert offset is None
        assert drop_pad_mode == 0
        assert row_idx_type == 0
        assert active_num == expert_idx.numel()
        assert active_expert_range == [0, expert_num]
        assert expert_tokens_num_type == 1, "per-expert counts"
        assert expert_tokens_num_flag
        flat = expert_idx.reshape(-1).long()
        assert bool(((flat >= 0) & (flat < expert_num)).all())
        order = torch.sort(flat, stable=True).indices
        destination = torch.empty_like(order)
        destination[order] = torch.arange(order.numel())
        sorted_x = x[order // expert_idx.shape[1]]
        counts = torch.bincount(flat, minlength=expert_num).to(torch.int64)
        return sorted_x, destination.to(torch.int32), counts, None

    def npu_grouped_matmul(
        self,
        x: list[torch.Tensor],
        weight: list[torch.Tensor],
        *,
        split_item: int,
        group_list_type: int,
        group_type: int,
        group_list: torch.Tensor,
        output_dtype: torch.dtype,
        bias: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """One matmul per group of rows: rows of group g times ``weight[0][g]`` ``[in, out]``."""
        self.calls.append(
            (
                "npu_grouped_matmul",
                (x, weight),
                {
                    "split_item": split_item,
                    "group_list_type": group_list_type,
                    "group_type": group_type,
                    "group_list": group_list,
                    "output_dtype": output_dtype,
                },
            )
        )
        assert len(x) == 1
        assert len(weight) == 1
        assert bias is None
        assert split_item == 2, "one output tensor"
        assert group_type == 0, "groups split the rows (M)"
        assert group_list_type == 1, "group_list holds per-group counts"
        assert group_list.dtype == torch.int64
        rows, weights = x[0], weight[0]
        assert weights.dim() == 3, "weight [g, in, out]"
        assert weights.shape[1] == rows.shape[1], "weight [g, in, out]"
        assert rows.dtype == weights.dtype == output_dtype
        assert rows.dtype in FLOATS
        assert int(group_list.sum()) == rows.shape[0]
        outputs = [
            (part.float() @ weights[g].float()).to(output_dtype)
            for g, part in enumerate(rows.split(group_list.tolist()))
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
        self.calls.append(
            (
                "npu_moe_finalize_routing",
                (expanded_permuted_rows, scales, expanded_src_to_dst_row, export_for_source_row),
                {"skip1": skip1, "skip2": skip2, "bias": bias, "drop_pad_mode": drop_pad_mode},
            )
        )
        assert skip1 is None
        assert skip2 is None
        assert bias is None
        assert drop_pad_mode == 0
        assert scales.dtype == expanded_permuted_rows.dtype, "scales take the rows' dtype"
        assert scales.shape == export_for_source_row.shape
        tokens, k = scales.shape
        rows = expanded_permuted_rows[expanded_src_to_dst_row.long()].view(tokens, k, -1)
        out = (rows.float() * scales.float().unsqueeze(-1)).sum(dim=1)
        return out.to(expanded_permuted_rows.dtype)


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
