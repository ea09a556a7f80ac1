"""The test space the attention contracts share: head layouts, options, batches, pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._strenum import StrEnum

__all__ = ["OPTIONS", "Option", "option_attributes", "shape_name"]


class Option(StrEnum):
    """One layer option a case turns on (``plain``: none)."""

    PLAIN = "plain"
    WINDOW = "window"  # sliding window of 4 (Gemma-2/3, Mistral)
    SOFTCAP = "softcap"  # logit soft-cap 1.0 (Gemma-2 uses 50 on far larger scores)
    SCALE = "scale"  # a softmax scale that is not 1/sqrt(head_dim)
    NONCAUSAL = "noncausal"  # an encoder-only layer (extend only)


OPTIONS: tuple[Option, ...] = tuple(Option)
WINDOW = 4
SOFTCAP = 1.0
CUSTOM_SCALE = 0.3


def option_attributes(option: Option, head_dim: int) -> dict[str, Any]:
    """The :func:`~.common.attention_layer` keywords of ``option``."""
    attributes: dict[str, Any] = {"scaling": head_dim**-0.5}
    if option is Option.WINDOW:
        attributes["sliding_window_size"] = WINDOW
    elif option is Option.SOFTCAP:
        attributes["logit_cap"] = SOFTCAP
    elif option is Option.SCALE:
        attributes["scaling"] = CUSTOM_SCALE
    elif option is Option.NONCAUSAL:
        attributes["is_causal"] = False
    return attributes


def shape_name(p: Mapping[str, Any]) -> str:
    """``heads=8/2,head_dim=128[/v64],page=4``: the part of a case name about its shapes."""
    v = "" if p["v_head_dim"] == p["head_dim"] else f"/v{p['v_head_dim']}"
    return f"heads={p['heads']}/{p['kv_heads']},head_dim={p['head_dim']}{v},page={p['page_size']}"
