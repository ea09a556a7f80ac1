"""A MkDocs hook: the op contracts' pages, rendered from the contracts themselves.

A page holding the marker line ``<!-- sglang-fl: op contracts -->`` gets, in its place, one
section per standard op built from :meth:`sglang_fl.ops.OpContract.describe`: the same data
``sglang-fl explain OP`` prints (the contract in words, its rules as formulas, the layer
attributes it reads, dtypes and tolerances, the in-place rules, every case the kit runs). The
text therefore lives once, in ``core/src/sglang_fl/ops``. Needs core and torch importable in
the environment that builds the site (``nox -s lint`` installs both).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from rst_roles import markdown_from_rst  # a sibling of this hook (not a package)

MARKER = "<!-- sglang-fl: op contracts -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from sglang_fl.ops import STANDARD_OPS

    sections = [contract_markdown(contract.describe()) for contract in STANDARD_OPS.values()]
    return markdown.replace(MARKER, "\n\n".join(sections))


def _escaped(text: str) -> str:
    """A formula as literal text: ``*`` and ``_`` are Markdown emphasis otherwise."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")


def contract_markdown(contract: dict[str, Any]) -> str:
    """One op's section (the shape of ``sglang_fl.schema.ContractJson``)."""
    cases = len(contract["cases"])
    lines = [
        f"### `{contract['op']}`",
        "",
        f"`{contract['signature']}`, SGLang layer `{contract['sglang_layer']}`: "
        f"{contract['summary']}.",
        "",
        markdown_from_rst(contract["details"]),
        "",
    ]
    if contract["rules"]:
        lines += ["**Rules**", ""]
        lines += [f"- **{r['name']}**: {_escaped(r['formula'])}" for r in contract["rules"]]
        lines.append("")
    if contract["layer_attributes"]:
        attributes = ", ".join(f"`{a}`" for a in contract["layer_attributes"])
        lines += [f"**Layer attributes read** (`obj`): {attributes}", ""]
    lines += ["| dtype | atol | rtol |", "| --- | --- | --- |"]
    lines += [f"| `{t['dtype']}` | {t['atol']:g} | {t['rtol']:g} |" for t in contract["tolerances"]]
    lines += ["", f"**In place**, over the kit's {cases} cases:", ""]
    for entry in contract["in_place"]:
        rule = []
        if entry["written"]:
            outputs = ", ".join(str(i) for i in entry["outputs"])
            rule.append(f"written in place, returned as output {outputs} ({entry['written']})")
        if entry["untouched"]:
            rule.append(f"must stay untouched ({entry['untouched']})")
        lines.append(f"- `{entry['argument']}`: {'; '.join(rule)}")
    sizes = contract["world_sizes"]
    runs = f" × {len(sizes)} world sizes ({', '.join(map(str, sizes))} ranks)" if sizes else ""
    lines += [
        "",
        f"**Kit**: {cases} cases × {len(contract['dtypes'])} dtypes{runs} = "
        f"{contract['checks']} checks against the reference:",
        "",
        "```text",
        *contract["cases"],
        "```",
    ]
    return "\n".join(lines)
