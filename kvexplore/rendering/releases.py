"""One deployment's pages across vLLM releases, as data and drawn.

Pages travel between release environments as JSON data
(:func:`kvexplore.pages.page_facts`): per KV cache group, the first layer's page of block 0
with its segments (``[label, start, size, dtype]``).  The functions here draw
that data for several releases on one byte axis, so a reader sees a block
grow from 544 to 576 tokens or a page's padding change without reading a
table.

>>> page_summary([["conv", 0, 36864, "bfloat16"], ["ssm", 36864, 1048576, "float32"],
...               ["pad", 1085440, 28672, ""]])
'conv 36,864 B | ssm 1,048,576 B | pad 28,672 B'
>>> page_summary([["K|V p0", 0, 65536, "bfloat16"], ["K|V p1", 65536, 65536, "bfloat16"]])
'K|V x2 131,072 B'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from kvexplore.rendering.figures import MAX_INNER_LABELS, byte_axis, legend, rows_figure
from kvexplore.rendering.html import bar_html, bar_row, legend_html, message_html
from kvexplore.rendering.segments import Segment, fmt_size, kind_of


def page_summary(segments: Sequence[Sequence[Any]]) -> str:
    """A page's segments in one line: runs of one kind as ``kind xN bytes``."""
    runs: list[list[Any]] = []
    for label, _start, size, *_ in segments:
        kind = str(label).split(" ")[0]
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
            runs[-1][2] += int(size)
        else:
            runs.append([kind, 1, int(size)])
    return " | ".join(f"{k}{f' x{n}' if n > 1 else ''} {b:,} B" for k, n, b in runs)


@dataclass(frozen=True)
class _Page:
    """What :func:`~kvexplore.rendering.figures.rows_figure` needs of a page."""

    page_bytes: int
    segments: tuple[Segment, ...]


def _collapsed(pages: Sequence[Mapping[str, Any]]) -> list[tuple[str, _Page]]:
    """Consecutive groups with the same page as one row: ``'g0-g2 mamba x6'``."""
    out: list[
        tuple[str, _Page, str, str]
    ] = []  # (first gid, page, rest of label, last gid)
    for page in pages:
        gid, _, rest = str(page["group"]).partition(" ")
        segs = tuple(
            Segment(str(label), int(start), int(size), str(dtype))
            for label, start, size, dtype in page["segments"]
        )
        item = _Page(int(page["page_bytes"]), segs)
        if out and out[-1][1] == item and out[-1][2] == rest:
            out[-1] = (out[-1][0], item, rest, gid)
        else:
            out.append((gid, item, rest, gid))
    return [
        (f"{a}{'' if a == b else '-' + b.lstrip('g')} {rest}", item)
        for a, item, rest, b in out
    ]


def _pages(pages_by_release: Mapping[str, Sequence[Mapping[str, Any]]]):
    """``(row name, page)``: groups in order, each release's page of a group
    next to the others' (identical consecutive groups collapsed)."""
    rows = {release: _collapsed(pages) for release, pages in pages_by_release.items()}
    for i in range(max((len(r) for r in rows.values()), default=0)):
        for release, collapsed in rows.items():
            if i < len(collapsed):
                name, page = collapsed[i]
                yield f"vLLM {release} · {name}", page


def release_pages_figure(
    title: str, pages_by_release: Mapping[str, Sequence[Mapping[str, Any]]]
):
    """Every release's pages (:func:`kvexplore.pages.page_facts` per release), one row per
    release and group, on one byte axis."""
    rows = list(_pages(pages_by_release))
    page = max((p.page_bytes for _, p in rows), default=1)
    fig, ax, axis_in, kinds = rows_figure(
        title,
        [(name, p.segments, 0, page, MAX_INNER_LABELS) for name, p in rows],
        1.45 + 0.5 * max(1, len(rows)),
        width=float(page),
        empty="(no pages)",
    )
    byte_axis(
        ax,
        [s for _, p in rows for s in p.segments],
        page,
        axis_in,
        "byte offset in one layer's page of a block",
    )
    legend(fig, kinds)
    return fig


def release_pages_html(
    pages_by_release: Mapping[str, Sequence[Mapping[str, Any]]],
) -> str:
    """:func:`release_pages_figure` as HTML bars (no image), with a legend."""
    rows = list(_pages(pages_by_release))
    if not rows:
        return message_html("no release gave a page map", "warning")
    page = max(p.page_bytes for _, p in rows)
    bars = "".join(
        bar_row(f"{name} ({fmt_size(p.page_bytes)})", bar_html(p.segments, page), 260)
        for name, p in rows
    )
    kinds = [kind_of(s.label) for _, p in rows for s in p.segments]
    return f'<div class="kvx-release-pages">{legend_html(kinds)}{bars}</div>'


def releases_html(head: str, pages_by_release, table_html: str) -> str:
    """A comparison across releases: ``head``, the pages drawn, the table."""
    return (
        f'<div class="kvx-releases"><p>{escape(head)}</p>'
        f"{release_pages_html(pages_by_release)}{table_html}</div>"
    )


__all__ = [
    "page_summary",
    "release_pages_figure",
    "release_pages_html",
    "releases_html",
]


#: Cell colours of the vLLM x LMCache grid, by outcome.
OUTCOME_COLOURS = {
    "edited": "#4c9a2a",
    "as registered": "#9ecae1",
    "blocked": "#fdae6b",
    "refused": "#d62728",
}


def _cells(rows: Sequence[Mapping[str, Any]]):
    pairs = list(dict.fromkeys((r["vllm"], r["lmcache"]) for r in rows))
    groups = sorted({(r["group"], r["kind"]) for r in rows})
    cell = {(r["vllm"], r["lmcache"], r["group"]): r for r in rows}
    return pairs, groups, cell


def matrix_figure(title: str, rows: Sequence[Mapping[str, Any]], pairs_order=None):
    """A grid: one row per (vLLM, LMCache) pair, one column per KV cache
    group, each cell coloured by what LMCache does (edited, left as
    registered, blocked, refused) and labelled with the rule."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    pairs, groups, cell = _cells(rows)
    if pairs_order:
        pairs = [p for p in pairs_order if p in pairs]
    fig = Figure(
        figsize=(2.2 + 2.6 * max(len(groups), 1), 0.9 + 0.32 * max(len(pairs), 1))
    )
    ax = fig.add_subplot()
    for y, (vllm, lmcache) in enumerate(pairs):
        for x, (group, _) in enumerate(groups):
            r = cell.get((vllm, lmcache, group))
            if r is None:
                continue
            ax.add_patch(
                Rectangle((x, y), 0.96, 0.9, color=OUTCOME_COLOURS[r["outcome"]], lw=0)
            )
            label = r["rule"] or r["outcome"]
            ax.text(x + 0.48, y + 0.45, label, ha="center", va="center", fontsize=6.5)
    ax.set_xlim(0, max(len(groups), 1))
    ax.set_ylim(len(pairs), 0)
    ax.set_xticks([x + 0.48 for x in range(len(groups))])
    ax.set_xticklabels([f"group {g}\n{kind}" for g, kind in groups], fontsize=8)
    ax.set_yticks([y + 0.45 for y in range(len(pairs))])
    ax.set_yticklabels([f"vLLM {v} / LMCache {m}" for v, m in pairs], fontsize=7.5)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)
    ax.legend(
        handles=[Patch(color=c, label=o) for o, c in OUTCOME_COLOURS.items()],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7.5,
        frameon=False,
    )
    fig.tight_layout()
    return fig


def matrix_html(
    title: str, rows: Sequence[Mapping[str, Any]], deployments: Mapping[tuple, object]
) -> str:
    """The same grid as an HTML table: cells coloured by outcome, the rule and
    the shapes (or the reason) in each cell, LMCache's verdict per row."""
    pairs, groups, cell = _cells(rows)
    head = "".join(f"<th>group {g}<br>{escape(str(k))}</th>" for g, k in groups)
    body = []
    for vllm, lmcache in pairs:
        refusal = deployments.get((vllm, lmcache))
        verdict = "accepted" if refusal is None else "refused"
        tds = []
        for group, _ in groups:
            r = cell.get((vllm, lmcache, group))
            if r is None:
                tds.append("<td></td>")
                continue
            detail = (
                f"{r['shape_before']} &rarr; {r['shape_after']}"
                if r["outcome"] == "edited"
                else escape(str(r["reason"] or ""))[:160]
            )
            tds.append(
                f'<td style="background:{OUTCOME_COLOURS[r["outcome"]]}" '
                f'title="{escape(str(r["reason"] or ""))}">'
                f"<b>{escape(r['rule'] or r['outcome'])}</b><br>"
                f'<span style="font-size:85%">{detail}</span></td>'
            )
        body.append(
            f"<tr><th>vLLM {escape(vllm)}</th><th>LMCache {escape(lmcache)}</th>"
            f"<td>{verdict}</td>{''.join(tds)}</tr>"
        )
    return (
        f"<div><b>{escape(title)}</b><table>"
        f"<tr><th>vLLM</th><th>LMCache</th><th>deployment</th>{head}</tr>"
        f"{''.join(body)}</table></div>"
    )
