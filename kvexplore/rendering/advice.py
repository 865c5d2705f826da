"""The advisor's answers drawn: :class:`~kvexplore.advising.Advice` and
:class:`~kvexplore.advising.ReleaseAdvice` as text, HTML and figures.

The figure is the trade-off: concurrent requests against the shared-prefix
tokens reused, one point per setting that starts (its size the GPUs it
uses), the Pareto front joined, the recommended setting circled, and the
settings vLLM refuses listed beside the axes with the check that refused
them.
"""

from __future__ import annotations

from html import escape

from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html, pre_html, table_html

#: The columns the text and HTML forms show, in this order.
SHOWN = ("tensor_parallel_size", "data_parallel_size", "enable_prefix_caching",
         "prefix_match_unit", "max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype",
         "gpus", "starts", "kv_cache_size_tokens", "max_concurrency", "concurrent_requests",
         "prefix_reused_tokens", "cache_hit_alignment", "front", "recommended")


def _shown(advice):
    t = advice.table
    cols = [c for c in SHOWN if c in t and (c in ("gpus", "starts") or t[c].notna().any())]
    return t[cols]


def _head(advice) -> str:
    w = advice.workload
    length = f"{w.max_model_len:,}-token requests" if w.max_model_len else "the model's length"
    return (f"{advice.model} on {advice.gpus} x {advice.gpu}, vLLM {advice.release}: "
            f"{w.concurrency:,} at once of {length}, {w.shared_prefix:,} shared-prefix tokens; "
            f"objective {advice.objective}")


def _refused_line(row) -> str:
    message = (row["refusal"] or "").split(". ")[0]
    return message[:160]


def advice_text(advice) -> str:
    """``Advice.text()``: the question, the recommendation and its command
    (or the ways out when nothing starts), the searched settings as a
    table, and why each setting that starts was not recommended."""
    import pandas as pd

    lines = [_head(advice), advice.note]
    if advice.command is not None:
        lines.append(f"run: {advice.command}")
    for way in advice.nearest:
        verdict = "starts" if way["starts"] else "still refused"
        lines.append(f"way out of vLLM's defaults: {way['flags']}: {verdict}; {way['why']}")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        lines += ["", _shown(advice).to_string()]
    why = [(i, r["why_not"]) for i, r in enumerate(advice.rows) if r["why_not"]]
    if why:
        lines += ["", "not recommended:"]
        lines += [f"  {i}: {text}" for i, text in why]
    return "\n".join(lines)


def advice_html(advice) -> str:
    """``Advice._repr_html_()``: :func:`advice_text`'s parts, the command to
    copy, and the table."""
    parts = [f"<div class=\"kvx-advice\"><p><b>{escape(_head(advice))}</b></p>",
             message_html(advice.note, "info" if advice.recommended_index is not None
                          else "error")]
    if advice.command is not None:
        parts.append(pre_html(advice.command))
    for way in advice.nearest:
        parts.append(message_html(f"way out: {way['flags']} ({way['why']})", "warning"))
    t = advice.table
    parts.append(table_html(_shown(advice).assign(why_not=t["why_not"])))
    parts.append("</div>")
    return "".join(parts)


def advice_figure(advice):
    """Concurrent requests against prefix tokens reused, per setting that
    starts (marker size: GPUs), the Pareto front as a line, the recommended
    setting circled in red; the refused settings counted in the title and
    their first refusal named."""
    fig = new_figure(6.4, 3.6)
    ax = fig.subplots()
    rows = list(advice.rows)
    started = [r for r in rows if r["starts"]]
    refused = [r for r in rows if not r["starts"]]
    if started:
        ax.scatter([r["prefix_reused_tokens"] for r in started],
                   [r["concurrent_requests"] for r in started],
                   s=[30 * r["gpus"] for r in started],
                   c=["#55A868" if r["holds_workload"] else "#8C8C8C" for r in started],
                   alpha=0.8, label="starts (green: holds the workload)")
        front = sorted((r for r in started if r["front"]),
                       key=lambda r: (r["prefix_reused_tokens"], -r["concurrent_requests"]))
        ax.step([r["prefix_reused_tokens"] for r in front],
                [r["concurrent_requests"] for r in front], where="pre", color="#4C72B0", lw=1,
                label="Pareto front")
    if advice.recommended_index is not None:
        best = rows[advice.recommended_index]
        ax.scatter([best["prefix_reused_tokens"]], [best["concurrent_requests"]], s=160,
                   facecolors="none", edgecolors="#C44E52", lw=2, label="recommended")
    if advice.workload.concurrency > 1:
        ax.axhline(advice.workload.concurrency, color="#C44E52", ls=":", lw=1,
                   label=f"asked: {advice.workload.concurrency:,}")
    ax.set_xlabel("shared-prefix tokens reused by a later request", fontsize=8)
    ax.set_ylabel("requests served at once", fontsize=8)
    ax.tick_params(labelsize=7)
    title = f"{advice.model}, {advice.gpus} x {advice.gpu}, vLLM {advice.release}"
    if refused:
        title += f"\n{len(refused)} of {len(rows)} settings refused, e.g. {_refused_line(refused[0])[:70]}"
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def release_advice_text(ra) -> str:
    """``ReleaseAdvice.text()``: each release's recommendation."""
    out = []
    for release, advice in ra.answers.items():
        out.append(f"vLLM {release}: {advice.note}")
        out.append(f"  run: {advice.command}" if advice.command else "  nothing starts")
    return "\n".join(out)


def release_advice_html(ra) -> str:
    """``ReleaseAdvice._repr_html_()``: the recommendations side by side."""
    return table_html(ra.recommendations)


def release_advice_figure(ra):
    """Each release's trade-off figure's points in one axes, one colour per
    release, the recommendations circled."""
    fig = new_figure(6.4, 3.6)
    ax = fig.subplots()
    colours = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")
    for k, (release, advice) in enumerate(ra.answers.items()):
        started = [r for r in advice.rows if r["starts"]]
        colour = colours[k % len(colours)]
        ax.scatter([r["prefix_reused_tokens"] for r in started],
                   [r["concurrent_requests"] for r in started], color=colour, alpha=0.6,
                   label=f"vLLM {release}")
        if advice.recommended_index is not None:
            best = advice.rows[advice.recommended_index]
            ax.scatter([best["prefix_reused_tokens"]], [best["concurrent_requests"]], s=160,
                       facecolors="none", edgecolors=colour, lw=2)
    ax.set_xlabel("shared-prefix tokens reused by a later request", fontsize=8)
    ax.set_ylabel("requests served at once", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
