"""Matplotlib figures of layouts, plans and sweeps, drawn from segments.

Each segment is coloured by its kind
(:data:`~kvexplore.rendering.segments.COLORS`); rows are capped at
:data:`~kvexplore.rendering.segments.MAX_DRAWN_SEGMENTS` rectangles.  Figures
are pyplot-free ``matplotlib.figure.Figure`` objects with an Agg canvas.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from kvexplore.rendering.segments import (
    COLORS,
    LEGEND_TEXT,
    ZOOM_BLOCKS,
    Segment,
    capped,
    fmt_size,
    kind_of,
    legend_kinds,
)

#: Rows of a buffer map drawn (the text form lists them all).
MAX_DRAWN_ROWS = 12
#: Ticks on a byte axis at most.
MAX_TICKS = 8
#: Callouts per row at most (the widest thin segments win).
MAX_CALLOUTS = 4
#: Labels inside rectangles per row at most (a buffer map's zoom row: :data:`ZOOM_BLOCKS`).
MAX_INNER_LABELS = 6
#: Kinds worth a callout when too thin for an inner label.
CALLOUT_KINDS = frozenset({"pad", "conv", "ssm", "state", "latent", "c_kv", "k_pe", "edited"})
#: Width of a rows figure (inches) and the distance between its rows (y units).
FIG_WIDTH = 10.0
ROW_GAP = 1.6

_FONT = 7
_CHAR_IN = 0.58 * _FONT / 72  # average glyph width in inches at the label font size


def text_width_in(text: str, fontsize: float = _FONT) -> float:
    """Estimated width of ``text`` in inches (average glyph 0.58 em)."""
    return len(text) * 0.58 * fontsize / 72


def new_figure(width: float, height: float):
    """A pyplot-free ``Figure`` with an Agg canvas (``savefig`` works)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def spread(positions: Sequence[float], widths: Sequence[float], lo: float, hi: float) -> list[float]:
    """Centres for labels wanted at ``positions`` (sorted) with ``widths``,
    moved as little as possible so none overlap and all stay in ``[lo, hi]``.

    >>> spread([0.5, 0.52, 0.54], [0.1, 0.1, 0.1], 0.0, 1.0)
    [0.42, 0.52, 0.62]
    """
    n = len(positions)
    if not n:
        return []
    out = list(positions)
    for i in range(n):
        left = lo + widths[i] / 2 if i == 0 else out[i - 1] + (widths[i - 1] + widths[i]) / 2
        out[i] = max(out[i], left)
    for i in range(n - 1, -1, -1):
        right = hi - widths[i] / 2 if i == n - 1 else out[i + 1] - (widths[i + 1] + widths[i]) / 2
        out[i] = min(out[i], right)
    # centre each cluster of touching labels on the mean of its wanted positions
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(out[j + 1] - out[j] - (widths[j] + widths[j + 1]) / 2) < 1e-9:
            j += 1
        shift = sum(positions[i:j + 1]) / (j - i + 1) - sum(out[i:j + 1]) / (j - i + 1)
        lo_room = out[i] - widths[i] / 2 - (lo if i == 0 else out[i - 1] + widths[i - 1] / 2)
        hi_room = (hi if j == n - 1 else out[j + 1] - widths[j + 1] / 2) - out[j] - widths[j] / 2
        shift = max(-lo_room, min(hi_room, shift))
        for k in range(i, j + 1):
            out[k] += shift
        i = j + 1
    return [round(x, 9) for x in out]


def byte_label(offset: int) -> str:
    """A byte-axis tick label: ``'0'``, ``'36 KiB'``, ``'1.06 MiB'``."""
    return "0" if offset == 0 else fmt_size(offset)


def byte_ticks(bounds: Sequence[int], lo: int, hi: int, axis_in: float) -> list[int]:
    """Tick offsets from ``bounds`` whose labels do not collide on an axis
    ``axis_in`` inches wide; ``lo`` and ``hi`` are always kept."""
    span = max(hi - lo, 1)

    def room(a: int, b: int) -> float:
        return (text_width_in(byte_label(a), 6) + text_width_in(byte_label(b), 6)) / 2 + 0.08

    kept = [lo]
    for b in sorted(set(bounds)):
        if b <= lo or b >= hi:
            continue
        x_prev = (kept[-1] - lo) / span * axis_in
        x = (b - lo) / span * axis_in
        if x - x_prev >= room(kept[-1], b) and axis_in - x >= room(b, hi):
            kept.append(b)
    kept.append(hi)
    if len(kept) > MAX_TICKS:  # keep an even spread
        step = (len(kept) - 1) / (MAX_TICKS - 1)
        kept = sorted({kept[round(i * step)] for i in range(MAX_TICKS)})
    return kept


def _boxes(verts, kinds: Sequence[str], **kwargs) -> list:
    """``PolyCollection``s of rectangles ``verts`` in their kinds' colours,
    and of the hatch over the padding and elided ones."""
    from matplotlib.collections import PolyCollection

    boxes = [PolyCollection(verts, facecolors=[COLORS[k] for k in kinds], edgecolors="black",
                            linewidths=0.4, **kwargs)]
    hatched = [i for i, k in enumerate(kinds) if k in ("pad", "...")]
    if hatched:
        boxes.append(PolyCollection(verts[hatched], facecolors="none", edgecolors="#777777",
                                    linewidths=0, hatch="//", **kwargs))
    return boxes


def legend(fig, kinds: Sequence[str], *, y_in: float = 0.12) -> None:
    """One swatch and name per kind present, in ``KINDS`` order, centred on
    one line ``y_in`` inches above the bottom edge (names: gid ``"legend"``)."""
    import numpy as np

    present = legend_kinds(kinds)
    if not present:
        return
    w, h = fig.get_figwidth(), fig.get_figheight()
    sw, gap = 0.16, 0.06  # swatch width and gap, inches
    widths = [sw + gap + text_width_in(LEGEND_TEXT[k], 6) + 0.18 for k in present]
    x = (w - sum(widths)) / 2
    verts = []
    for k, width in zip(present, widths, strict=True):
        x0, x1 = x / w, (x + sw) / w
        y0, y1 = (y_in - 0.045) / h, (y_in + 0.045) / h
        verts.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        fig.text((x + sw + gap) / w, y_in / h, LEGEND_TEXT[k], fontsize=6, va="center", ha="left", gid="legend")
        x += width
    for box in _boxes(np.array(verts), present, transform=fig.transFigure):
        fig.add_artist(box)


#: Tick mark length and the gap under it, in points (matplotlib's defaults).
_TICK_PT, _TICK_PAD_PT, _TICK_FONT = 3.5, 3.5, 6


def x_ticks(ax, positions: Sequence[float], labels: Sequence[str], xlabel: str) -> None:
    """Tick marks (one ``LineCollection``, gid ``"x-tick-marks"``), their
    labels (texts, gid ``"x-tick"``) and the axis label under ``ax``."""
    from matplotlib.collections import LineCollection

    ax.set_xticks([])
    trans = ax.get_xaxis_transform()  # x in data, y in axes fractions
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    mark = _TICK_PT / height_pt
    ax.add_collection(LineCollection(
        [[(x, 0.0), (x, -mark)] for x in positions], colors="black", linewidths=0.8,
        transform=trans, clip_on=False, gid="x-tick-marks",
    ), autolim=False)
    below = -(_TICK_PT + _TICK_PAD_PT) / height_pt
    for x, label in zip(positions, labels, strict=True):
        ax.text(x, below, label, transform=trans, ha="center", va="top",
                fontsize=_TICK_FONT, gid="x-tick", clip_on=False)
    pad = _TICK_PT + _TICK_PAD_PT + 1.3 * _TICK_FONT
    ax.set_xlabel(xlabel, fontsize=_FONT, labelpad=pad)


def byte_axis(ax, segments: Sequence[Segment], page: int, axis_in: float, xlabel: str) -> None:
    """A ``[0, page]`` byte axis with ticks at the segments' starts (:func:`byte_ticks`)."""
    bounds = [s.start for s in segments if s.kind not in ("...", "gap")]
    ticks = byte_ticks(bounds, 0, page, axis_in)
    ax.set_xlim(0, float(page))
    x_ticks(ax, ticks, [byte_label(t) for t in ticks], xlabel)


def draw_row(ax, y: float, segments: Sequence[Segment], lo: int, hi: int, width: float,
             axis_in: float, most_labels: int = MAX_INNER_LABELS) -> list[str]:
    """Row ``y``: one rectangle per segment (capped), bytes ``[lo, hi)`` scaled
    onto ``[0, width)`` of an axis ``axis_in`` inches wide; at most
    ``most_labels`` inner labels, callouts for thin :data:`CALLOUT_KINDS`.
    Returns the kinds drawn; the row's ``PolyCollection`` carries the labels
    as ``segment_labels``.
    """
    import numpy as np

    scale = width / max(hi - lo, 1)
    inch = axis_in / width  # inches per x unit
    drawn = [s for s in capped(segments) if s.kind != "gap"]
    if not drawn:
        return []
    x0 = np.array([(s.start - lo) * scale for s in drawn], dtype=float)
    x1 = x0 + np.array([s.size * scale for s in drawn], dtype=float)
    y0 = np.full_like(x0, y - 0.4)
    y1 = np.full_like(x0, y + 0.4)
    verts = np.stack(
        [np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1), np.stack([x0, y1], 1)],
        axis=1,
    )
    kinds = [kind_of(s.label) for s in drawn]
    boxes = _boxes(verts, kinds)
    boxes[0].segment_labels = [s.label for s in drawn]
    for box in boxes:
        ax.add_collection(box, autolim=False)
    inner, thin = [], []
    for i, s in enumerate(drawn):
        if text_width_in(s.label) + 0.06 <= (x1[i] - x0[i]) * inch:
            inner.append(i)
        elif kinds[i] in CALLOUT_KINDS and s.size > 0:
            thin.append(i)
    if len(inner) > most_labels:
        inner = inner[::math.ceil(len(inner) / most_labels)]
    mids = (x0 + x1) / 2
    placed: list[tuple[float, float]] = []
    for i in inner:  # segments may overlap
        half = (text_width_in(drawn[i].label) + 0.06) / inch / 2
        if any(mids[i] - half < b and a < mids[i] + half for a, b in placed):
            continue
        placed.append((mids[i] - half, mids[i] + half))
        ax.text(mids[i], y, drawn[i].label, ha="center", va="center", fontsize=_FONT, clip_on=True)
    _callouts(ax, y, drawn, kinds, thin, mids, width, inch)
    return kinds


def _callouts(ax, y: float, drawn, kinds, thin, mids, width: float, inch: float) -> None:
    """Callouts with leader lines above row ``y``: one per ``(kind, size)``
    of ``thin`` (repeated ones marked ``(each)``), the widest :data:`MAX_CALLOUTS`."""
    from matplotlib.collections import LineCollection

    first: dict[tuple[str, int], int] = {}
    for i in thin:
        first.setdefault((kinds[i], drawn[i].size), i)
    thin = sorted(sorted(first.values(), key=lambda i: -drawn[i].size)[:MAX_CALLOUTS])
    if not thin:
        return
    texts = [f"{drawn[i].label} {fmt_size(drawn[i].size)}" for i in thin]
    counts = Counter((k, s.size) for k, s in zip(kinds, drawn, strict=True))
    repeated = {t: counts[(kinds[i], drawn[i].size)] > 1 for t, i in zip(texts, thin, strict=True)}
    want = [mids[i] for i in thin]
    at = spread(want, [(text_width_in(t) + 0.08) / inch for t in texts], 0.0, width)
    lines = []
    for x_want, x_at, t in zip(want, at, texts, strict=True):
        ax.text(x_at, y + 0.95, t + (" (each)" if repeated[t] else ""), ha="center", va="center",
                fontsize=_FONT - 0.5)
        lines.append([(x_want, y + 0.4), (x_at, y + 0.8)])
    ax.add_collection(LineCollection(lines, colors="#444444", linewidths=0.6), autolim=False)


def rows_figure(title: str, rows: Sequence[tuple], height: float, *, width: float,
                empty: str = "(none)", top_in: float = 0.5, bottom_in: float = 0.62):
    """A :data:`FIG_WIDTH`-inch figure of ``rows`` (``(name, segments, lo, hi,
    most_labels)``, each drawn by :func:`draw_row`), top to bottom on one
    Axes; names are texts with gid ``"row-name"``.  Returns ``(fig, ax,
    axis_in, kinds)``."""
    fig = new_figure(FIG_WIDTH, height)
    names = [r[0] for r in rows] or [empty]
    longest = max((len(n) for n in names), default=0)
    left = min(0.45, (0.12 + longest * _CHAR_IN) / FIG_WIDTH)
    ax = fig.add_axes((left, bottom_in / height, 0.98 - left, 1 - (bottom_in + top_in) / height))
    ax.set_ylim(-0.6, (len(names) - 1) * ROW_GAP + 1.2)
    ax.set_yticks([])
    trans = ax.get_yaxis_transform()
    for i, name in enumerate(reversed(names)):
        ax.text(-0.006, i * ROW_GAP, name, transform=trans, ha="right", va="center",
                fontsize=_FONT, gid="row-name")
    ax.set_title(title, fontsize=8, loc="left")
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    axis_in = ax.get_position().width * FIG_WIDTH
    kinds: list[str] = []
    for i, (_, segs, lo, hi, most) in enumerate(rows):
        kinds += draw_row(ax, (len(rows) - 1 - i) * ROW_GAP, segs, lo, hi, width, axis_in, most)
    return fig, ax, axis_in, kinds


def page_title(lay) -> str:
    """``'Qwen/Qwen3.5-0.8B on A100, tp=1, ...' + layer, kind, group, block, page``."""
    return (f"{lay.plan_label}\n{lay.layer} ({lay.label or lay.kind}, group {lay.group}), "
            f"{lay.registration} registration, block {lay.block}: "
            f"{fmt_size(lay.page_bytes)} page")


def page_figure(lay, *, title: bool = True, legend_row: bool = True):
    """A :class:`~kvexplore.rendering.layouts.PageLayout` as a figure: the
    registered page, kernel page 0 (own scale) and the edited view (same
    byte axis as the registered row).  ``title=False`` / ``legend_row=False``
    leave the title / legend out.
    """
    rows = [("registered", lay.segments, lay.page_bytes)]
    if lay.cells:
        end = max(s.end for s in lay.cells)
        rows.append((f"kernel page 0 zoom, 0-{fmt_size(end)}", lay.cells, end))
    if lay.edited is not None and lay.edited.segments:
        rows.append(("edited", lay.edited.segments, lay.page_bytes))
    top_in = 0.5 if title else 0.15
    bottom_in = 0.62 if legend_row else 0.42
    fig, ax, axis_in, kinds = rows_figure(
        page_title(lay) if title else "",
        [(name, segs, 0, max(hi, max(s.end for s in segs)), MAX_INNER_LABELS) for name, segs, hi in rows],
        top_in + bottom_in + 0.33 + 0.62 * len(rows),
        width=float(lay.page_bytes), top_in=top_in, bottom_in=bottom_in,
    )
    byte_axis(ax, lay.segments, lay.page_bytes, axis_in, "byte offset in the page")
    if legend_row:
        legend(fig, kinds)
    fig.kvexplore_kinds = tuple(dict.fromkeys(kinds))
    return fig


def buffer_figure(lay):
    """A :class:`~kvexplore.rendering.layouts.BufferLayout` as a figure: one
    row per buffer (each scaled to its own size) plus the zoom."""
    rows = [(r.name, r.segments, 0, max((s.end for s in r.segments), default=r.size) or 1,
             MAX_INNER_LABELS) for r in lay.rows[:MAX_DRAWN_ROWS]]
    if lay.block_zoom:
        rows.append(("zoom: " + lay.zoom_label.split(" of ")[0], lay.block_zoom,
                     min(s.start for s in lay.block_zoom), max(s.end for s in lay.block_zoom),
                     ZOOM_BLOCKS))
    title = f"{lay.plan_label}\nbuffer map: {lay.registration} registration ({lay.layout}), {lay.num_blocks} blocks"
    if len(lay.rows) > MAX_DRAWN_ROWS:
        title += f"; {len(lay.rows) - MAX_DRAWN_ROWS} more buffers in the text form"
    fig, ax, _, kinds = rows_figure(title, rows, 1.3 + 0.5 * max(1, len(rows)), width=1.0)
    ax.set_xlim(0, 1)
    x_ticks(ax, [0, 1], ["start", "end"], "each row scaled to its own buffer")
    legend(fig, kinds)
    return fig


def pages_figure(title: str, names: Sequence[str], pages: Sequence):
    """``pages`` (page layouts) one row each, on one shared byte axis."""
    page = max((lay.page_bytes for lay in pages), default=1)
    rows = [(name, lay.segments, 0, page, MAX_INNER_LABELS)
            for name, lay in zip(names, pages, strict=True)]
    fig, ax, axis_in, kinds = rows_figure(title, rows, 1.45 + 0.5 * max(1, len(pages)),
                                          width=float(page), empty="(no groups)")
    byte_axis(ax, [s for lay in pages for s in lay.segments], page, axis_in,
              "byte offset in one layer's page of a block")
    legend(fig, kinds)
    return fig


def sweep_figure(table, x: str, y: str, value: str, context: str = ""):
    """Heatmap of a pivoted sweep ``table`` (``y`` rows x ``x`` columns), cells
    annotated, missing ones blank, titled ``value`` and ``context``."""
    import numpy as np

    arr = table.to_numpy(dtype=float)
    fig = new_figure(1.8 + 0.8 * max(1, arr.shape[1]), 1.3 + 0.45 * max(1, arr.shape[0]))
    ax = fig.subplots()
    masked = np.ma.masked_invalid(arr)
    im = ax.imshow(masked, aspect="auto", cmap="viridis")
    ax.set_xticks(range(arr.shape[1]))
    ax.set_xticklabels([str(c) for c in table.columns], fontsize=7, rotation=30)
    ax.set_yticks(range(arr.shape[0]))
    ax.set_yticklabels([str(i) for i in table.index], fontsize=7)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(f"{value}: {context}" if context else value, fontsize=9)
    if arr.size <= 400:
        finite = arr[np.isfinite(arr)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0
        for (i, j), v in np.ndenumerate(arr):
            if not np.isnan(v):
                ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=6,
                        color="black" if v > mid else "white")
    fig.colorbar(im, ax=ax)
    return fig


def bar_chart(df, x: str, y: str, *, hue: str | None = None, title: str = "",
              ylabel: str | None = None, fmt: str = "{:,.0f}", log: bool = False):
    """Grouped bars of ``df[y]`` over ``df[x]`` (one colour per ``hue`` value),
    each annotated with ``fmt``; ``log=True``: a symmetric log axis."""
    import numpy as np

    xs = list(dict.fromkeys(df[x].tolist()))
    hues = list(dict.fromkeys(df[hue].tolist())) if hue else [None]
    fig = new_figure(max(5.0, 0.9 + 0.35 * len(xs) * len(hues)), 3.2)
    ax = fig.subplots()
    width = 0.8 / len(hues)
    cmap = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C"]
    for k, h in enumerate(hues):
        sub = df if h is None else df[df[hue] == h]
        vals = {row[x]: row[y] for _, row in sub.iterrows()}
        pos = np.arange(len(xs)) + (k - (len(hues) - 1) / 2) * width
        heights = [float(vals.get(v, np.nan)) for v in xs]
        bars = ax.bar(pos, heights, width * 0.95, color=cmap[k % len(cmap)],
                      label=None if h is None else str(h))
        for rect, v in zip(bars, heights, strict=True):
            if not math.isnan(v):
                ax.text(rect.get_x() + rect.get_width() / 2, rect.get_height(), fmt.format(v),
                        ha="center", va="bottom", fontsize=6, rotation=90 if len(xs) * len(hues) > 8 else 0)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([str(v) for v in xs], fontsize=7, rotation=30 if len(xs) > 4 else 0, ha="right" if len(xs) > 4 else "center")
    ax.set_ylabel(ylabel or y, fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    if log:
        ax.set_yscale("symlog", linthresh=1)
    ax.margins(y=0.18)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if hue:
        ax.legend(fontsize=7, frameon=False, title=hue, title_fontsize=7)
    fig.tight_layout()
    return fig
