"""Tables (markdown), the target verdicts and the start-up plot, all read from one result dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BOUND_TARGET = 1.05  # bound callable vs a direct call
ROUTED_TARGET = 1.10  # routed SGLang layer vs the same layer on forward_native, small tensors
REFERENCE_TARGET = 1.05  # reference kernel vs SGLang's forward_native

# The marked sections of the documentation's benchmarks page (docs/benchmarks.md) that
# ``run.py --update-docs`` rewrites.
DOC_START = "<!-- bench:start -->"
DOC_END = "<!-- bench:end -->"
DOC_E2E_START = "<!-- bench-e2e:start -->"
DOC_E2E_END = "<!-- bench-e2e:end -->"


def _ns(value: float) -> str:
    return f"{value / 1000:,.1f} µs" if value >= 10_000 else f"{value:,.0f} ns"


def _verdict(value: float, target: float) -> str:
    return f"{value:.3f}" if value <= target else f"**{value:.3f}**"


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per target: the worst figure over the rows it applies to, met or missed."""
    rows = result["calls"]["results"]
    small = [r for r in rows if r["size"] == "small"]

    def worst(items: list[dict[str, Any]], key: str) -> dict[str, Any]:
        return max(items, key=lambda r: r["ratios"][key])

    lines = []
    for name, key, items, target in (
        ("bound callable / direct call (small)", "bound/direct", small, BOUND_TARGET),
        (
            "bound callable with a fallback / direct call (small)",
            "bound_fallback/direct",
            small,
            BOUND_TARGET,
        ),
        (
            "routed SGLang layer / layer on forward_native (small)",
            "routed_layer/torch_layer",
            small,
            ROUTED_TARGET,
        ),
        ("reference / forward_native (all)", "direct/forward_native", rows, REFERENCE_TARGET),
        (
            "routed layer, custom ops available / not (small)",
            "routed_layer/routed_plain",
            small,
            BOUND_TARGET,
        ),
    ):
        w = worst(items, key)
        value = w["ratios"][key]
        lines.append(
            {
                "target": name,
                "limit": target,
                "worst": value,
                "worst_cpu": w["cpu_ratios"][key],
                "worst_row": f"{w['case']} {w['size']} {w['dtype']}",
                "rows_met": sum(r["ratios"][key] <= target for r in items),
                "rows": len(items),
                "met": value <= target,
            }
        )
    verify_off = [r for r in rows if "verify_off_is_fn" in r]
    if verify_off:
        lines.append(
            {
                "target": "verify off: the forward bound is the chosen implementation itself",
                "limit": None,
                "worst": None,
                "worst_row": (
                    f"same object in {sum(r['verify_off_is_fn'] for r in verify_off)}/"
                    f"{len(verify_off)} rows: the 'routed layer' column is the verify-off cost"
                ),
                "met": all(r["verify_off_is_fn"] for r in verify_off),
            }
        )
    same = [r for r in rows if r["bound_is_chosen_fn"]]
    if same:
        # ``bound`` is the very function ``direct`` calls: any difference is the machine's noise.
        w = max(same, key=lambda r: abs(r["ratios"]["bound/direct"] - 1))
        lines.append(
            {
                "target": "noise floor: the same callable timed as 'bound' and 'direct' (info)",
                "limit": None,
                "worst": w["ratios"]["bound/direct"],
                "worst_cpu": w["cpu_ratios"]["bound/direct"],
                "worst_row": f"{w['case']} {w['size']} {w['dtype']}",
                "met": None,
            }
        )
    for env in result["startup"]["environments"]:
        lines.append(
            {
                "target": f"load + resolve <= scan + 20 ms ({env['distributions']} distributions)",
                "limit": env["target_ms"],
                "worst": env["load_resolve_ms"],
                "worst_row": (
                    f"scan {env['scan_ms']:.1f} ms, excess {env['excess_over_scan_ms']:+.1f} ms "
                    f"(CPU time: {env['excess_over_scan_cpu_ms']:+.1f} ms)"
                ),
                "met": env["target_met"],
                "met_cpu": env["target_met_cpu"],
            }
        )
    check = result["startup"]["import_check"]
    lines.append(
        {
            "target": "importing sglang_fl + loading plugins imports no SDK / SGLang",
            "limit": None,
            "worst": None,
            "worst_row": "tried: "
            + "; ".join(
                f"{phase}: {', '.join(names) or 'none'}"
                for phase, names in check["attempts"].items()
            )
            + ". With stub SDKs installed, imported: "
            + "; ".join(
                f"{phase}: {', '.join(names) or 'none'}"
                for phase, names in check["with_stub_sdks"]["imported"].items()
                if phase != "import torch"
            ),
            "met": check["ok"],
        }
    )
    return lines


def calls_table(result: dict[str, Any]) -> str:
    head = (
        "| op | tokens | dtype | direct | bound × | bound+fallback × | routed layer | "
        "torch layer | routed/torch × | forward_native | reference/native × | "
        "custom ops on/off × |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = []
    for r in result["calls"]["results"]:
        m, q = r["median_ns"], r["ratios"]
        routed_limit = ROUTED_TARGET if r["size"] == "small" else float("inf")
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['dtype']} | {_ns(m['direct'])} | "
            f"{_verdict(q['bound/direct'], BOUND_TARGET)} | "
            f"{_verdict(q['bound_fallback/direct'], BOUND_TARGET)} | "
            f"{_ns(m['routed_layer'])} | {_ns(m['torch_layer'])} | "
            f"{_verdict(q['routed_layer/torch_layer'], routed_limit)} | "
            f"{_ns(m['forward_native'])} | "
            f"{_verdict(q['direct/forward_native'], REFERENCE_TARGET)} | "
            f"{_verdict(q['routed_layer/routed_plain'], BOUND_TARGET)} |"
        )
    return head + "\n".join(lines) + "\n"


def startup_table(result: dict[str, Any]) -> str:
    head = (
        "| environment | distributions | one `entry_points()` scan | load + resolve | "
        "excess over scan | CPU-time excess | target ≤ scan + 20 ms | `sglang-fl ops` wall | "
        "`import torch` wall |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n"
    )
    lines = []
    for e in result["startup"]["environments"]:
        kind = "synthetic" if e["kind"] == "synthetic" else "SGLang venv (real)"
        lines.append(
            f"| {kind} | {e['distributions']} | {e['scan_ms']:.1f} ms | "
            f"{e['load_resolve_ms']:.1f} ms | {e['excess_over_scan_ms']:+.1f} ms | "
            f"{e['excess_over_scan_cpu_ms']:+.1f} ms | "
            f"{'met' if e['target_met'] else '**missed**'} | "
            f"{e['sglang_fl_ops_wall_ms']:,.0f} ms | {e['import_torch_wall_ms']:,.0f} ms |"
        )
    return head + "\n".join(lines) + "\n"


def targets_table(result: dict[str, Any]) -> str:
    head = (
        "| target | limit | measured (worst) | where | verdict |\n"
        "| --- | ---: | ---: | --- | --- |\n"
    )
    lines = []
    for t in result["targets"]:
        limit = "" if t["limit"] is None else f"{t['limit']:.2f}"
        worst = "" if t["worst"] is None else f"{t['worst']:.3f}"
        if t.get("worst_cpu") is not None:
            worst += f" (CPU time {t['worst_cpu']:.3f})"
        if "rows" in t:
            worst += f" ({t['rows_met']}/{t['rows']} rows met)"
        verdict = "info" if t["met"] is None else "met" if t["met"] else "**missed**"
        if "met_cpu" in t and t["met_cpu"] != t["met"]:
            verdict += f" ({'met' if t['met_cpu'] else 'missed'} in CPU time)"
        lines.append(f"| {t['target']} | {limit} | {worst} | {t['worst_row']} | {verdict} |")
    return head + "\n".join(lines) + "\n"


def _overhead_line(result: dict[str, Any]) -> str:
    overhead = result["calls"].get("dispatch_overhead")
    if not overhead:
        return ""
    parts = ", ".join(f"{op}: +{ns:.0f} ns" for op, ns in overhead["closure_ns"].items())
    rows = result["calls"]["results"]
    itself = sum(bool(r.get("custom_ops_bind_fn_itself")) for r in rows)
    line = (
        "The fallback closure (what `bound+fallback` adds over a direct call), measured on "
        f"implementations that do nothing: {parts} per call. With custom ops available, the "
        f"routed layers were bound to the chosen implementation itself in {itself} of "
        f"{len(rows)} rows (`custom ops on/off ×` is then the row's noise floor).\n"
    )
    if "verify_spent_ns" in overhead:
        line += (
            "Verify mode on, once a layer class's checked calls are spent (`SGLANG_FL_VERIFY=N`"
            f" after N calls), on the same no-op rms_norm: +{overhead['verify_spent_ns']:.0f} "
            "ns per call; with verify off nothing is added (the same object is bound).\n"
        )
    return line


def markdown(result: dict[str, Any], plot_path: str | None) -> str:
    env = result["calls"]["environment"]
    parts = [
        f"Measured {result['date']} on {result['machine']['cpus']} CPUs ({env['processor']}), "
        f"Python {env['python']}, torch {env['torch']} ({env['torch_threads']} thread), "
        f"SGLang {env['sglang']}, sglang-fl {env['sglang_fl']}; "
        f"commit {result.get('commit') or 'unknown'}. Command: `{result['command']}`.",
        "",
        "**Targets** (ratios are medians of interleaved repetitions; bold = over the limit)",
        "",
        targets_table(result),
        "**Per-call cost** (median per call; × = ratio to the column it is compared with)",
        "",
        calls_table(result),
        _overhead_line(result),
        "**Start-up** (medians of fresh interpreters; core + three vendor plugins installed)",
        "",
        startup_table(result),
    ]
    if plot_path:
        parts.append(f"![start-up cost vs installed distributions]({plot_path})\n")
    return "\n".join(parts)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Start-up cost vs installed distributions (PNG); ``None`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    envs = result["startup"]["environments"]
    synthetic = sorted(
        (e for e in envs if e["kind"] == "synthetic"), key=lambda e: e["distributions"]
    )
    real = [e for e in envs if e["kind"] != "synthetic"]
    x = [e["distributions"] for e in synthetic]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(x, [e["scan_ms"] for e in synthetic], "o-", label="one entry_points() scan")
    left.plot(x, [e["load_resolve_ms"] for e in synthetic], "s-", label="sglang-fl load + resolve")
    left.plot(
        x, [e["target_ms"] for e in synthetic], "--", color="grey", label="target: scan + 20 ms"
    )
    for e in real:
        left.plot(e["distributions"], e["scan_ms"], "o", color="C0", mfc="none", ms=9)
        left.plot(e["distributions"], e["load_resolve_ms"], "s", color="C1", mfc="none", ms=9)
        left.annotate(
            "SGLang venv",
            (e["distributions"], e["load_resolve_ms"]),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    left.set_xscale("log")
    left.set_xlabel("installed distributions")
    left.set_ylabel("ms (median, fresh interpreter)")
    left.set_title("Plugin discovery + resolving every op")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(
        x, [e["sglang_fl_ops_wall_ms"] / 1000 for e in synthetic], "s-", label="sglang-fl ops"
    )
    right.plot(
        x,
        [e["import_torch_wall_ms"] / 1000 for e in synthetic],
        "o-",
        label='python -c "import torch"',
    )
    right.set_xscale("log")
    right.set_xlabel("installed distributions")
    right.set_ylabel("s (median wall time)")
    right.set_title("Command wall time")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def e2e_markdown(result: dict[str, Any]) -> str:
    """The end-to-end throughput table: both variants, their spread, the ratio and its target."""
    e = result["e2e"]
    fl, native = e["tokens_per_s"]["sglang-fl"], e["tokens_per_s"]["forward_native"]
    paired = e["paired_ratios"]
    verdict = "met" if e["met"] else "**missed**"
    return (
        f"Measured {result['date']} on {result['machine']['cpus']} CPUs "
        f"(load average {result['machine']['load_average'][0]:.1f} at the start, "
        f"{result['load_average_end'][0]:.1f} at the end: a shared machine); "
        f"commit {result.get('commit') or 'unknown'}. "
        f"Command: `{result['command']}`. {e['model']} in {e['dtype']}, a batch of "
        f"{e['batch']} chat prompts ({min(e['prompt_tokens'])}-{max(e['prompt_tokens'])} "
        f"tokens), {e['new_tokens']} new tokens each, {e['repetitions']} alternating "
        "repetitions after one warm-up batch per engine.\n\n"
        "| engine | decode tokens/s (median) | min | max |\n"
        "| --- | ---: | ---: | ---: |\n"
        f"| sglang-fl routing ({', '.join(e['routed_ops']['sglang-fl'])}) | "
        f"{fl['median']:.1f} | {fl['min']:.1f} | {fl['max']:.1f} |\n"
        "| SGLang `forward_native` (`SGLANG_FORCE_FUSED_OP_BACKEND=torch`) | "
        f"{native['median']:.1f} | {native['min']:.1f} | {native['max']:.1f} |\n\n"
        f"Ratio of medians (sglang-fl / forward_native): **{e['ratio']:.3f}**, target ≥ "
        f"{e['target']:.2f}: {verdict}. Per-repetition ratios: median {paired['median']:.3f}, "
        f"range {paired['min']:.3f}-{paired['max']:.3f}.\n"
    )


def update_section(
    page: Path, text: str, start_marker: str = DOC_START, end_marker: str = DOC_END
) -> bool:
    """Replace what lies between two markers in ``page``; False if they are missing."""
    content = page.read_text()
    start, end = content.find(start_marker), content.find(end_marker)
    if start < 0 or end < start:
        return False
    page.write_text(content[: start + len(start_marker)] + "\n" + text + content[end:])
    return True
