"""Text, HTML and figures of a read log (:class:`~kvexplore.logs.reading.VllmLog`),
a log checked against kvexplore (:class:`~kvexplore.logs.checking.LogCheck`)
and a calibration (:class:`~kvexplore.capacity_planning.Calibration`)."""

from __future__ import annotations

import pandas as pd

from kvexplore.layout import GiB
from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html, pairs_html, pre_html, table_html

#: One colour per memory term, as the capacity figure draws them.
TERM_COLOURS = {
    "weight_bytes": ("weights", "#7f8c8d"),
    "activation_peak_bytes": ("activation peak", "#e67e22"),
    "non_torch_bytes": ("non-torch", "#c0392b"),
    "cudagraph_bytes": ("CUDA graphs", "#8e44ad"),
    "not stated (residual)": ("not stated (residual)", "#d5d8dc"),
    "kv_cache_memory_bytes": ("KV cache", "#2980b9"),
}


def _frame_text(df: pd.DataFrame) -> str:
    with pd.option_context(
        "display.max_rows",
        None,
        "display.max_columns",
        None,
        "display.width",
        250,
        "display.max_colwidth",
        80,
    ):
        return df.to_string(index=False)


def _log_head(log) -> str:
    name = log.name or "log"
    release = log.release or "not stated"
    return (
        f"{name}: {len(log.figures)} figures on {log.num_lines} lines, vLLM {release}; "
        f"{len(log.unread)} unread line(s), {len(log.contradictions)} contradiction(s)"
    )


def log_text(log) -> str:
    """Headline, the figures table, the deployment it implies and what it leaves out."""
    parts = [_log_head(log), _frame_text(log.table.drop(columns=["what"]))]
    parts.append(
        "deployment: " + ", ".join(f"{k}={v!r}" for k, v in log.deployment.items())
    )
    parts.append("not stated: " + ", ".join(log.not_stated))
    if log.unread:
        parts.append(
            "\n".join(f"unread line {n}: {text[:160]}" for n, text in log.unread)
        )
    if len(log.contradictions):
        parts.append(_frame_text(log.contradictions))
    return "\n\n".join(parts)


def log_html(log) -> str:
    parts = [
        pairs_html(
            [
                ("log", log.name or "-"),
                ("vLLM", log.release or "not stated"),
                ("figures", len(log.figures)),
                ("lines", log.num_lines),
            ]
        ),
        table_html(log.table.drop(columns=["what"])),
        pairs_html([("not stated", ", ".join(log.not_stated))]),
    ]
    parts += [
        message_html(f"unread line {n}: {text[:160]}", "warning")
        for n, text in log.unread
    ]
    if len(log.contradictions):
        parts.append(message_html("the log contradicts itself:", "error"))
        parts.append(table_html(log.contradictions))
    return "".join(parts)


def log_figure(log):
    """The log's memory figures as one bar (GiB per rank)."""
    fig = new_figure(8, 1.9)
    ax = fig.subplots()
    left = 0.0
    for name, (label, colour) in TERM_COLOURS.items():
        if name in log and name != "not stated (residual)":
            try:
                value = log.get(name)
            except ValueError:
                continue
            ax.barh(
                [0],
                [value / GiB],
                left=left,
                color=colour,
                label=f"{label}: {value / GiB:.2f} GiB",
            )
            left += value / GiB
    ax.set_yticks([])
    ax.set_xlabel("GiB per rank (as the log states them)")
    ax.set_title(_log_head(log), fontsize=8)
    if left:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3)
    fig.subplots_adjust(bottom=0.45, top=0.8)
    return fig


def check_text(c) -> str:
    """The release note, how the deployment was read, the comparison table."""
    head = (
        f"{c.title}, planned with vLLM {c.planned}: {int((c.rows.equal == True).sum())} of "  # noqa: E712
        f"{len(c.rows)} figures equal, {len(c.differences)} differ"
    )
    table = c.rows[
        [
            "figure",
            "line",
            "log",
            "kvexplore",
            "equal",
            "kvexplore at the log's KV memory",
            "term",
        ]
    ]
    return "\n\n".join(
        [
            head,
            c.release_note,
            "\n".join(c.notes),
            _frame_text(table),
            "\n".join(f"{r.figure}: {r.rule}" for r in c.rows.itertuples()),
        ]
    )


def check_html(c) -> str:
    level = "info" if c.release == c.planned else "warning"
    parts = [
        message_html(c.release_note, level),
        pre_html("\n".join(c.notes)),
        table_html(c.rows),
    ]
    if len(c.contradictions):
        parts.append(message_html("the log contradicts itself:", "error"))
        parts.append(table_html(c.contradictions))
    return "".join(parts)


def check_figure(c):
    """The log's memory beside kvexplore's, term by term (GiB per rank)."""
    bars = c.memory_bars
    fig = new_figure(9, 2.8)
    ax = fig.subplots()
    for y, column in ((1, "log"), (0, "kvexplore")):
        left = 0.0
        for row in bars[bars.term != "requested"].itertuples(index=False):
            value = getattr(row, column)
            if value is None or value != value or value <= 0:
                continue
            label, colour = TERM_COLOURS[row.term]
            ax.barh([y], [value / GiB], left=left, color=colour, label=label)
            if value / GiB > 1.5:
                ax.text(
                    left + value / GiB / 2,
                    y,
                    f"{value / GiB:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )
            left += value / GiB
    requested = bars.set_index("term").loc["requested", "log"]
    ax.axvline(
        requested / GiB,
        color="k",
        lw=1,
        ls="--",
        label="requested (utilization x total)",
    )
    ax.set_yticks(
        [1, 0], [f"log (vLLM {c.release or '?'})", f"kvexplore (vLLM {c.planned})"]
    )
    ax.set_xlabel("GiB per rank")
    ax.set_title(
        f"{c.title}: the log's memory and kvexplore's",
        fontsize=9,
    )
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, lab in zip(handles, labels, strict=True):
        seen.setdefault(lab, h)
    ax.legend(
        seen.values(),
        seen.keys(),
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=6,
    )
    fig.subplots_adjust(left=0.18, bottom=0.35, top=0.85)
    return fig


def calibration_text(c) -> str:
    return c.explain() + "\n\n" + _frame_text(c.table.drop(columns=["source"]))


def calibration_html(c) -> str:
    return pre_html(c.explain().splitlines()[0]) + table_html(c.table)


def calibration_figure(c):
    """The calibration's terms as one bar, measured ones solid."""
    fig = new_figure(8, 1.9)
    ax = fig.subplots()
    left = 0.0
    for row in c.table.itertuples(index=False):
        if row.term == "total_memory_bytes" or row.bytes is None:
            continue
        label, colour = TERM_COLOURS[row.term]
        ax.barh(
            [0],
            [row.bytes / GiB],
            left=left,
            color=colour,
            alpha=1.0 if row.measured else 0.4,
            label=f"{label}: {row.bytes / GiB:.2f} GiB"
            + ("" if row.measured else " (est.)"),
        )
        left += row.bytes / GiB
    if c.total_memory_bytes:
        ax.axvline(c.total_memory_bytes / GiB, color="k", lw=1, ls="--", label="total")
    ax.set_yticks([])
    ax.set_xlabel("GiB per rank")
    ax.set_title(f"calibration: {c.model or '?'} on {c.gpu}", fontsize=8)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3)
    fig.subplots_adjust(bottom=0.45, top=0.8)
    return fig


__all__ = [
    "calibration_figure",
    "calibration_html",
    "calibration_text",
    "check_figure",
    "check_html",
    "check_text",
    "log_figure",
    "log_html",
    "log_text",
]
