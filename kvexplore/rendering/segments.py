"""Segments, their kinds' colours and byte units, shared by every layout,
text, HTML bar and figure.

>>> fmt_size(28672), fmt_size(1114112), fmt_size(512)
('28 KiB', '1.06 MiB', '512 B')
>>> fmt_bytes(1114112)
'1,114,112 B'
>>> kind_of("K|V p3"), kind_of("b7"), kind_of("L12")
('K|V', 'other blocks', 'other layers')
"""

from __future__ import annotations

from collections.abc import Sequence

from kvexplore.layout import compress_ints
from kvexplore.pages import Segment

#: Rectangles per figure row or HTML bar at most (see :func:`capped`).
MAX_DRAWN_SEGMENTS = 64

#: Blocks a buffer map's zoom shows (and labels, every one).
ZOOM_BLOCKS = 8

#: Every kind of segment, in legend order: its colour and its legend name.
KINDS = {
    "conv": ("#4C72B0", "conv state"),
    "ssm": ("#55A868", "SSM state"),
    "state": ("#8172B2", "state"),
    "K": ("#DD8452", "K"),
    "V": ("#C44E52", "V"),
    "K|V": ("#E8A06A", "K|V (side by side)"),
    "kv": ("#E8A06A", "K/V"),
    "latent": ("#937860", "MLA latent"),
    "c_kv": ("#937860", "c_kv"),
    "k_pe": ("#DA8BC3", "k_pe"),
    "edited": ("#64B5CD", "edited view"),
    "other blocks": ("#9DB9DC", "blocks"),
    "other layers": ("#D5C4EA", "layers"),
    "pad": ("#DDDDDD", "padding"),
    "gap": ("#FFFFFF", "other blocks' bytes"),
    "...": ("#BBBBBB", "elided"),
}
COLORS = {kind: color for kind, (color, _) in KINDS.items()}
LEGEND_TEXT = {kind: text for kind, (_, text) in KINDS.items()}


def legend_kinds(kinds) -> list[str]:
    """The distinct ``kinds``, in :data:`KINDS` order."""
    present = set(kinds)
    return [k for k in KINDS if k in present]


def fmt_bytes(n: int) -> str:
    """``1114112`` -> ``'1,114,112 B'``: exact, grouped, deterministic."""
    return f"{n:,} B"


def fmt_size(n: float) -> str:
    """Bytes in ``B`` below 1 KiB, else ``KiB`` / ``MiB`` / ``GiB`` with at
    most 3 significant digits."""
    n = float(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            value = n / scale
            text = f"{value:.3g}" if value < 1000 else f"{value:,.0f}"
            return f"{text} {unit}"
    return f"{n:.0f} B"


def kind_of(label: str) -> str:
    """The :data:`KINDS` key of a segment label (``'conv0'`` -> ``'conv'``,
    ``'[0, :]'`` -> ``'edited'``; unknown labels -> ``'state'``)."""
    head = label.split(" ")[0]
    if head.startswith("conv"):
        return "conv"
    if head.startswith("["):
        return "edited"
    if head[:1] == "b" and head[1:].isdigit():
        return "other blocks"
    if head[:1] == "L" and head[1:].isdigit():
        return "other layers"
    if head in COLORS:
        return head
    return "state"


def capped(segments: Sequence[Segment], limit: int = MAX_DRAWN_SEGMENTS) -> list[Segment]:
    """At most ``limit`` segments: the middle merged into one ``'...'``."""
    segs = list(segments)
    if len(segs) <= limit:
        return segs
    head = segs[: limit // 2]
    tail = segs[-(limit // 2 - 1):]
    middle = Segment("...", head[-1].end, tail[0].start - head[-1].end, "",
                     f"{len(segs) - len(head) - len(tail)} segments")
    return head + [middle] + tail


def overlap_summary(span: tuple[int, int], segments: Sequence[Segment]) -> str:
    """Which ``segments`` the byte span ``[a, b)`` falls on: labels and kinds
    with kernel-page ranges (``'K|V p0-8'``), partial overlaps with their bytes."""
    a, b = span
    by_kind: dict[str, list[int]] = {}
    partial: list[str] = []
    plain: dict[str, None] = {}
    for s in segments:
        lo, hi = max(a, s.start), min(b, s.end)
        if hi <= lo:
            continue
        if s.kernel_page is None:
            plain[s.label] = None
        else:
            by_kind.setdefault(s.kind, []).append(s.kernel_page)
        if hi - lo < s.size:
            partial.append(f"{s.label}: {hi - lo} of {s.size} B")
    parts = list(plain)
    parts += [f"{kind} p{compress_ints(pages)}" for kind, pages in by_kind.items()]
    text = ", ".join(parts) if parts else "nothing"
    if partial:
        text += " (" + "; ".join(partial) + ")"
    return text
