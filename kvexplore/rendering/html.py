"""HTML renderers for notebooks and the Explorer: every user string
escaped, output deterministic.

>>> table_html([{"a": 1, "b": "<x>"}])
'<table class="kvx-table"><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>&lt;x&gt;</td></tr></tbody></table>'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.rendering.figures import MAX_DRAWN_ROWS, page_title
from kvexplore.rendering.layouts import group_label, plan_pages
from kvexplore.rendering.segments import (
    COLORS,
    LEGEND_TEXT,
    capped,
    fmt_size,
    kind_of,
    legend_kinds,
)

#: Rows shown by :func:`table_html` before the rest is summarised.
MAX_ROWS = 200

_LEVEL_STYLE = {
    "error": "border-left:4px solid #c0392b;background:#fdecea;",
    "warning": "border-left:4px solid #e67e22;background:#fef5e7;",
    "info": "border-left:4px solid #2980b9;background:#eaf2f8;",
}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.6g}"
    return str(value)


def table_html(rows: Any, columns: Sequence[str] | None = None, *, max_rows: int = MAX_ROWS) -> str:
    """A table of a DataFrame or of dict rows (``max_rows`` shown)."""
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        columns = list(rows.columns) if columns is None else list(columns)
        records: list[Mapping[str, Any]] = rows.to_dict("records")
    else:
        records = list(rows)
        if columns is None:
            columns = list(records[0]) if records else []
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = []
    for rec in records[:max_rows]:
        body.append("<tr>" + "".join(f"<td>{escape(_cell(rec.get(c)))}</td>" for c in columns) + "</tr>")
    more = ""
    if len(records) > max_rows:
        more = f'<tr><td colspan="{len(columns)}">... {len(records) - max_rows} more rows</td></tr>'
    return (
        f'<table class="kvx-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}{more}</tbody></table>"
    )


def pairs_html(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column quantity/value table."""
    return table_html([{"quantity": k, "value": v} for k, v in pairs])


def message_html(text: str, level: str = "error") -> str:
    """A boxed message (errors in the Explorer); ``text`` is escaped, newlines kept."""
    style = _LEVEL_STYLE.get(level, _LEVEL_STYLE["info"])
    return (
        f'<div class="kvx-message kvx-{escape(level)}" style="{style}padding:4px 8px;'
        f'white-space:pre-wrap;font-family:monospace;font-size:12px">{escape(text)}</div>'
    )


def pre_html(text: str) -> str:
    """Monospace block for text forms (escaped)."""
    return f'<pre class="kvx-pre" style="font-size:11px;line-height:1.25">{escape(text)}</pre>'


def plan_html(plan) -> str:
    """``Plan._repr_html_``: header, key numbers, groups, derivation."""
    parts = [f"<div class=\"kvx-plan\"><p><b>{escape(repr(plan))}</b></p>"]
    parts.append("<details open><summary>summary</summary>")
    parts.append(table_html(plan.summary))
    parts.append("</details><details open><summary>KV cache groups</summary>")
    parts.append(table_html(plan.group_table))
    parts.append(plan_pages_html(plan))
    parts.append("</details><details open><summary>derivation</summary><ul>")
    for key, why in plan.derivation().items():
        parts.append(f"<li><code>{escape(str(key))}</code>: {escape(str(why))}</li>")
    parts.append("</ul></details></div>")
    return "".join(parts)


def plan_pages_html(plan) -> str:
    """One bar per KV cache group: the page of its first layer, on one byte scale."""
    try:
        pages = plan_pages(plan)
    except KVExploreError as exc:
        return message_html(f"page map unavailable: {exc}", "warning")
    page = max((lay.page_bytes for lay in pages), default=0)
    rows = [bar_row(f"{group_label(plan, g)} ({fmt_size(lay.page_bytes)})",
                     bar_html(lay.segments, page), 150)
            for g, lay in zip(plan.groups, pages, strict=True)]
    return f'<div class="kvx-plan-pages">{"".join(rows)}</div>'


def bar_row(name: str, bar: str, name_px: int) -> str:
    """A bar with its name in a ``name_px``-wide column on the left."""
    return (f'<div style="display:flex;align-items:center"><div style="width:{name_px}px;font-size:10px">'
            f"{escape(name)}</div><div style=\"flex:1\">{bar}</div></div>")


def bar_html(segments, total: int) -> str:
    """Segments as one flex bar of CSS widths (no bytes, no images)."""
    if not total:
        return ""
    lo = min((s.start for s in segments), default=0)
    hi = max(total, max((s.end for s in segments), default=0))
    span = max(hi - lo, 1)
    cells = []
    cursor = lo
    for s in capped(segments):
        if s.start > cursor:
            cells.append(f'<div style="flex:0 0 {100 * (s.start - cursor) / span:.4f}%"></div>')
        # segments may overlap: draw only the part past the cursor
        visible = s.end - max(s.start, cursor)
        if visible <= 0:
            continue
        width = 100 * visible / span
        color = "#ffffff" if s.kind == "gap" else COLORS[kind_of(s.label)]
        label = escape(s.label) if width >= 3 else ""
        title = escape(f"{s.label}: [{s.start:,}, {s.end:,}) {s.size:,} B {s.dtype} {s.detail}".strip())
        cells.append(
            f'<div title="{title}" style="flex:0 0 {width:.4f}%;background:{color};'
            f'border-right:1px solid #333;overflow:hidden;font-size:9px;text-align:center;'
            f'white-space:nowrap">{label}</div>'
        )
        cursor = max(cursor, s.end)
    return (
        '<div class="kvx-bar" style="display:flex;height:18px;border:1px solid #333;'
        f'margin:2px 0">{"".join(cells)}</div>'
    )


def page_layout_html(layout) -> str:
    """``PageLayout._repr_html_``: bars (page, kernel page 0, edited) and the text form."""
    segments = [*layout.segments, *layout.cells, *(layout.edited.segments if layout.edited is not None else ())]
    head = "<br>".join(escape(line) for line in page_title(layout).splitlines())
    return (f'<div class="kvx-page-map"><p style="font-size:11px;margin:2px 0"><b>{head}</b></p>'
            f"{legend_html([kind_of(seg.label) for seg in segments])}{page_bars_html(layout)}"
            f"{pre_html(layout.text())}</div>")


def legend_html(kinds) -> str:
    """The figures' legend of ``kinds`` as HTML."""
    items = "".join(
        f'<span style="margin-right:10px;white-space:nowrap"><span style="display:inline-block;'
        f'width:12px;height:9px;background:{COLORS[k]};border:1px solid #333;margin-right:3px">'
        f"</span>{escape(LEGEND_TEXT[k])}</span>"
        for k in legend_kinds(kinds)
    )
    return f'<div class="kvx-legend" style="font-size:10px;margin:2px 0">{items}</div>'


def page_bars_html(layout) -> str:
    """The bars of :func:`page_layout_html` alone."""
    bars = [bar_row("registered", bar_html(layout.segments, layout.page_bytes), 90)]
    if layout.cells:
        bars.append(bar_row("kernel page 0", bar_html(layout.cells, max(s.end for s in layout.cells)), 90))
    if layout.edited is not None and layout.edited.segments:
        bars.append(bar_row("edited", bar_html(layout.edited.segments, layout.page_bytes), 90))
    return "".join(bars)


def buffer_layout_html(layout) -> str:
    """``BufferLayout._repr_html_``: one bar per buffer and the text form."""
    bars = [bar_row(row.name, bar_html(row.segments, max((s.end for s in row.segments), default=row.size)), 160)
            for row in layout.rows[:MAX_DRAWN_ROWS]]
    return f'<div class="kvx-buffer-map">{"".join(bars)}{pre_html(layout.text())}</div>'


def comparison_table_html(comparison) -> str:
    """The rows of a :class:`~kvexplore.explorer.state.Comparison`, changed
    ones marked ``kvx-diff``."""
    la, lb = comparison.labels()
    head = (f"<tr><th></th><th>section</th><th>quantity</th><th>A: {escape(la)}</th>"
            f"<th>B: {escape(lb)}</th></tr>")
    body = []
    for r in comparison.rows:
        q, a, b = escape(r.quantity), escape(r.a), escape(r.b)
        if r.differs:
            q, b = f"<b>{q}</b>", f'<td class="kvx-changed" style="background:#ffd966"><b>{b}</b></td>'
        else:
            b = f"<td>{b}</td>"
        tr = '<tr class="kvx-diff" style="background:#fff3c4"><td>&#8800;</td>' if r.differs else "<tr><td></td>"
        body.append(f"{tr}<td>{escape(r.section)}</td><td>{q}</td><td>{a}</td>{b}</tr>")
    return (f'<table class="kvx-table kvx-compare"><thead>{head}</thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def comparison_summary_html(comparison) -> str:
    """How many compared quantities differ, each side's error, the page-map
    numbers that differ (:meth:`~kvexplore.explorer.state.Comparison.page_map_callouts`)."""
    n = len(comparison.differences)
    parts = [f"<p><b>{n}</b> of {len(comparison.rows)} compared quantities differ</p>"]
    for side, st in (("A", comparison.a), ("B", comparison.b)):
        if st.error:
            parts.append(message_html(f"{side}: {st.error}"))
    lines = comparison.page_map_callouts()
    if lines:
        parts.append(message_html("page maps differ in:\n" + "\n".join(lines), "warning"))
    else:
        parts.append(message_html("page maps: the compared numbers are the same", "info"))
    return "".join(parts)


def comparison_html(comparison, bars_a: str = "", bars_b: str = "") -> str:
    """:func:`comparison_summary_html`, each side's :func:`page_bars_html`
    (``bars_a`` / ``bars_b``) side by side, the table."""
    parts = [comparison_summary_html(comparison)]
    cols = [f'<div style="flex:1;min-width:0"><p><b>{side}</b>: {escape(label)}</p>{bars}</div>'
            for side, label, bars in zip("AB", comparison.labels(), (bars_a, bars_b), strict=True)]
    parts.append(f'<div class="kvx-compare-maps" style="display:flex;gap:12px">{"".join(cols)}</div>')
    parts.append(comparison_table_html(comparison))
    return f'<div class="kvx-comparison">{"".join(parts)}</div>'


__all__ = [
    "comparison_html",
    "comparison_summary_html",
    "comparison_table_html",
    "buffer_layout_html",
    "message_html",
    "page_bars_html",
    "page_layout_html",
    "pairs_html",
    "plan_html",
    "pre_html",
    "table_html",
]
