"""Page maps and buffer maps as data (:class:`PageLayout`,
:class:`BufferLayout`, each with ``text()``, ``_repr_html_()`` and
``figure()``), and sweep heatmaps.

>>> from kvexplore import plan
>>> p = plan("Qwen/Qwen3.5-0.8B", gpu="A100", attention_backend="FLASHINFER")
>>> lay = page_layout(p, 3)
>>> lay.kernel_pages, [s.label for s in lay.segments][:2]
(17, ['K|V p0', 'K|V p1'])
>>> [s.label for s in page_layout(p, 3, registration="legacy").segments][:3]
['K p0', 'V p0', 'K p1']
>>> [(s.label, s.start, s.size) for s in page_layout(p, 0).segments]
[('conv', 0, 36864), ('ssm', 36864, 1048576), ('pad', 1085440, 28672)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import MambaSpec

from kvexplore.display import Displayable
from kvexplore.editing.plan_edits import plan_edits
from kvexplore.errors import KVExploreError
from kvexplore.layout import dtype_name, element_extent, page_bytes, real_page_bytes
from kvexplore.pages import group_label, group_of, layer_page
from kvexplore.planning.planner import require_plan
from kvexplore.planning.release import release_name
from kvexplore.registration import check_registration_name
from kvexplore.rendering.figures import pages_figure, sweep_figure
from kvexplore.rendering.segments import (
    ZOOM_BLOCKS,
    Segment,
    fmt_bytes,
    overlap_summary,
)

#: Coordinates along the first per-block dim of an edited view listed one by one.
MAX_EDIT_COORDS = 16


def plan_head(plan) -> str:
    """``'Qwen/Qwen3.5-0.8B on A100, tp=1'``: how every title and label starts
    (``', pp=2 stage 1'`` added for one stage of a pipeline)."""
    stage = (f", pp={plan.pipeline_parallel_size} stage {plan.pipeline_parallel_rank}"
             if plan.pipeline_parallel_size > 1 else "")
    return f"{plan.model.name} on {plan.gpu.name}, tp={plan.tensor_parallel_size}{stage}"


def resolve_layer(plan, layer) -> tuple[int, Any]:
    """``(position, LayerInfo)`` for ``layer``: a position in ``plan.layers``
    (the KV-cache-bearing layers in vLLM's order, 0-based) or a layer name."""
    layers = plan.layers
    if isinstance(layer, str):
        for pos, info in enumerate(layers):
            if info.name == layer:
                return pos, info
        raise KVExploreError(
            f"layer {layer!r} is not a KV-cache layer of {plan.model.name}; expected a "
            f"name such as {layers[0].name!r} or a position 0..{len(layers) - 1}"
        )
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise KVExploreError(
            f"layer={layer!r} is invalid; expected a position 0..{len(layers) - 1} "
            "or a layer name"
        )
    if not 0 <= layer < len(layers):
        raise KVExploreError(
            f"layer={layer} is out of range for {plan.model.name}; expected "
            f"0..{len(layers) - 1} ({len(layers)} KV-cache layers)"
        )
    return layer, layers[layer]


@dataclass(frozen=True)
class EditedSide:
    """The same page seen through an edited view: which synthetic
    coordinates fall on which bytes."""

    rule: str | None
    shape: tuple[int, ...] | None
    stride: tuple[int, ...] | None
    dtype: str
    segments: tuple[Segment, ...]
    falls_on: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class PageLayout(Displayable):
    """One layer's page of one block, as byte segments.

    ``segments`` cover ``[0, page_bytes)`` in byte order (``gap`` segments
    where a layout splits a block's page); ``cells`` zoom into kernel page 0
    in memory order; ``edited`` is the after-edit view of the same bytes, or
    None.
    """

    plan_label: str
    layer: str
    position: int
    kind: str
    group: int
    spec: str
    registration: str
    layout: str
    block: int
    block_size: int
    kernel_block_size: int
    page_bytes: int
    real_bytes: int
    buffer: str
    page_offset: int
    views: tuple[str, ...]
    segments: tuple[Segment, ...]
    cells: tuple[Segment, ...] = ()
    cells_note: str = ""
    edited: EditedSide | None = None
    notes: tuple[str, ...] = field(default=())
    #: the kind as a reader needs it: ``"mamba (short_conv)"``, ``"full_attention (draft)"``
    label: str = ""

    @property
    def kernel_pages(self) -> int:
        return self.block_size // self.kernel_block_size if self.kernel_block_size else 1

    @property
    def padding_bytes(self) -> int:
        return self.page_bytes - self.real_bytes

    def __repr__(self) -> str:
        return self.text()


def _segment_table(segments: Sequence[Segment], total: int | None, *, limit: int | None = None) -> str:
    head = "  label              start        end       size"
    head += "   share" if total else ""
    head += "  dtype      detail"
    rows = [head]
    segs = list(segments)
    skipped = 0
    if limit is not None and len(segs) > limit:
        skipped = len(segs) - limit
        segs = segs[: limit - 1] + segs[-1:]
    for i, s in enumerate(segs):
        if skipped and i == len(segs) - 1:
            rows.append(f"  ... {skipped} more segments with the same stride")
        share = f" {100 * s.size / total:6.2f}%" if total else ""
        rows.append(
            f"  {s.label:<14} {s.start:>10,} {s.end:>10,} {s.size:>10,}{share}  "
            f"{s.dtype:<10} {s.detail}".rstrip()
        )
    return "\n".join(rows)


def page_layout_text(layout) -> str:
    """``PageLayout.text()``: deterministic (offsets, never addresses or timings)."""
    lines = [
        f"page map: {layout.layer} (layer position {layout.position}, {layout.label or layout.kind}, "
        f"group {layout.group}, {layout.spec})",
        f"plan: {layout.plan_label}",
        f"registration: {layout.registration} (layout {layout.layout})",
    ]
    lines += [f"  view: {v}" for v in layout.views]
    if layout.kernel_pages > 1:
        kp = layout.real_bytes // layout.kernel_pages
        shape = (
            f"{layout.kernel_pages} kernel pages x {fmt_bytes(kp)} (kernel block "
            f"{layout.kernel_block_size} of a {layout.block_size}-token block)"
        )
    else:
        shape = f"1 page for a {layout.block_size}-token block"
    pad = (
        f", padding {fmt_bytes(layout.padding_bytes)} "
        f"({100 * layout.padding_bytes / layout.page_bytes:.2f}%)"
        if layout.padding_bytes
        else ""
    )
    lines.append(f"page: {fmt_bytes(layout.page_bytes)} = {shape}{pad}")
    lines.append(
        f"block {layout.block}: page starts at byte {layout.page_offset:,} of {layout.buffer}"
    )
    lines.append(_segment_table(layout.segments, layout.page_bytes))
    if layout.cells:
        lines.append(f"kernel page 0 interior (memory order): {layout.cells_note}")
        lines.append(_segment_table(layout.cells, None))
    for note in layout.notes:
        lines.append(f"note: {note}")
    if layout.edited is not None:
        e = layout.edited
        lines.append("")
        if e.shape is None:
            lines.append(f"edited view: {e.note}")
        else:
            lines.append(
                f"edited view ({e.rule or 'no rule: registered object unchanged'}): "
                f"per block {list(e.shape)} {e.dtype}, strides {e.stride} elements"
                + (f"; {e.note}" if e.note else "")
            )
            lines.append("  coordinate              start        end       size  falls on (registered)")
            for seg, falls in zip(e.segments, e.falls_on, strict=True):
                lines.append(
                    f"  {seg.label:<20} {seg.start:>10,} {seg.end:>10,} {seg.size:>10,}  {falls}"
                )
    return "\n".join(lines)


def buffer_layout_text(layout) -> str:
    """``BufferLayout.text()``: each buffer's segments and the block zoom."""
    lines = [
        f"buffer map: {layout.plan_label}",
        f"registration: {layout.registration} (layout {layout.layout}), {layout.num_blocks} blocks",
    ]
    for r in layout.rows:
        lines.append(f"{r.name}: {fmt_bytes(r.size)} at offset {r.offset:,}; {r.detail}")
        lines.append(_segment_table(r.segments, None, limit=6))
    if layout.block_zoom:
        lines.append(f"zoom: {layout.zoom_label}")
        lines.append(_segment_table(layout.block_zoom, None, limit=6))
    lines += [f"note: {n}" for n in layout.notes]
    return "\n".join(lines)


def page_layout(
    plan,
    layer: int | str = 0,
    *,
    registration: str = "unified",
    block: int = 0,
    edited: Any = None,
) -> PageLayout:
    """The page of ``layer`` (see :func:`resolve_layer`) for block ``block``.

    ``registration``: ``"unified"`` (vLLM 0.33: ``[B, H, N, C]`` views, K|V
    side by side in ``C``) or ``"legacy"`` (``[pages, 2, kernel_block, H,
    D]``; Mamba ``[conv, ssm]`` views).  ``edited``: None (no after view),
    True (LMCache's default edits), an ``EditResult``/mapping of layer ->
    edited value, or this layer's edited tensor.  A layer, block or
    registration out of range raises ``KVExploreError``.  A plan without
    blocks (vLLM finds no memory for them) shows block 0 of the same layout,
    with a note saying so.
    """
    require_plan(plan)
    check_registration_name(registration)
    position, info = resolve_layer(plan, layer)
    notes, planned = _sliding_window_notes(info), plan.num_blocks
    if planned == 0:
        why = plan.admission.message if plan.admission else "no KV cache memory"
        notes += (f"no blocks: {release_name()} would not start ({why}); drawn: one block of the "
                  "same layout",)
        plan = plan.with_num_blocks(1)
    num_blocks = plan.num_blocks
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < num_blocks:
        raise KVExploreError(
            f"block={block!r} is out of range; expected 0..{num_blocks - 1} "
            f"({planned} blocks in this plan)"
        )
    name = info.name
    spec = plan.layer_specs[name]
    gid = group_of(plan, name)
    page_map = layer_page(plan, name, registration)
    page, segs = page_map.page_bytes, page_map.segments
    page_offset = page_map.page_offset(block)
    edited_side = None
    if edited is not None and edited is not False:
        edited_side = _edited_side(plan, name, registration, edited, block, page_offset, page, segs)
    return PageLayout(
        plan_label=(f"{plan_head(plan)}, dcp={plan.decode_context_parallel_size}, "
                    f"{plan.attention_backend}, block_size={plan.block_size}, "
                    f"kv_cache_dtype={plan.kv_cache_dtype}"),
        layer=name,
        position=position,
        kind=info.kind,
        label=info.label,
        group=gid,
        spec=type(spec).__name__,
        registration=registration,
        layout=plan.kv_cache_layout.name,
        block=block,
        block_size=spec.block_size,
        kernel_block_size=page_map.kernel_block_size,
        page_bytes=page,
        real_bytes=page_map.real_bytes,
        buffer=_buffer_name(plan, gid, name, registration),
        page_offset=int(page_offset),
        views=tuple(v.text() for v in page_map.views),
        segments=segs,
        cells=page_map.cells,
        cells_note=page_map.cells_note,
        edited=edited_side,
        notes=notes,
    )


def _buffer_name(plan, gid: int, name: str, registration: str) -> str:
    if registration == "unified":
        return "the backing buffer (shared by every KVCacheTensor)"
    j = plan.groups[gid].layer_names.index(name)
    return f"legacy buffer {j} (shared by layer {j} of every group)"


def _sliding_window_notes(info) -> tuple[str, ...]:
    if not info.sliding_window:
        return ()
    return (
        f"sliding window {info.sliding_window} tokens: the group keeps only the "
        "blocks of the window; the page itself is laid out like full attention",
    )


def _edited_side(plan, name, registration, edited, block, page_offset, page, registered) -> EditedSide:
    value, rule = edited, None
    if edited is True:
        try:
            edited = plan_edits(plan, registration)
        except KVExploreError as exc:
            return EditedSide(None, None, None, "", (), (), note=f"edits rejected this plan: {exc}")
    if isinstance(edited, Mapping):
        if name not in edited:
            raise KVExploreError(f"edited holds no layer {name!r}; expected the edited mapping of this plan")
        report = getattr(edited, "report", None)  # an EditResult names the rule of each layer
        rules = [] if report is None else list(report.loc[report["layer"] == name, "rule"])
        value, rule = edited[name], (rules[0] if rules and isinstance(rules[0], str) else None)
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in value):
            return EditedSide(rule, None, None, "", (), (),
                              note="no rule matched: still the registered list of state tensors")
        raise KVExploreError(f"edited value of layer {name!r} is {type(value).__name__}; expected "
                             "a tensor or the edited mapping (True for LMCache's edits)")
    if value.ndim == 0:
        raise KVExploreError(f"edited value of layer {name!r} is a 0-D tensor; expected this "
                             "layer's edited view, whose leading dim is the blocks")
    elem = value.element_size()
    per_block = tuple(value.shape[1:])
    strides = tuple(value.stride()[1:])
    dtype = dtype_name(value.dtype)
    if value.shape[0] != plan.num_blocks:
        return EditedSide(rule, per_block, strides, dtype, (), (),
                          note=f"leading dim {value.shape[0]} is not the {plan.num_blocks} "
                          "blocks: no rule re-viewed it")
    # block b of the edited view, relative to this layer's page of block b
    start0 = (value.storage_offset() + block * value.stride(0)) * elem - page_offset
    segs: list[Segment] = []
    if per_block and per_block[0] <= MAX_EDIT_COORDS:
        rest_shape = per_block[1:]
        rest_extent = element_extent(rest_shape, strides[1:]) * elem
        tail = "".join(", :" for _ in rest_shape)
        for i in range(per_block[0]):
            segs.append(Segment(f"[{i}{tail}]", start0 + i * strides[0] * elem, rest_extent, dtype,
                                f"{list(rest_shape)} {dtype}"))
    else:
        dims = ", ".join(f"0:{n}" for n in per_block)
        segs.append(Segment(f"[{dims}]", start0, element_extent(per_block, strides) * elem, dtype,
                            f"{list(per_block)} {dtype}"))
    falls = tuple(overlap_summary((s.start, s.end), registered) for s in segs)
    note = f"covers {sum(s.size for s in segs):,} of the page's {page:,} B"
    return EditedSide(rule, per_block, strides, dtype, tuple(segs), falls, note)


def page_map_text(plan, layer: int | str = 0, **kwargs) -> str:
    """Text form of :func:`page_map` (same arguments)."""
    return page_layout(plan, layer, **kwargs).text()


def page_map(plan, layer: int | str = 0, **kwargs):
    """:func:`page_layout`'s figure (same arguments; see
    :func:`kvexplore.rendering.figures.page_figure`)."""
    return page_layout(plan, layer, **kwargs).figure()


def plan_pages(plan, *, registration: str = "unified") -> tuple[PageLayout, ...]:
    """The page of each KV cache group's first layer, in group order."""
    return tuple(page_layout(plan, g.layer_names[0], registration=registration) for g in plan.groups)


def plan_title(plan) -> str:
    """``'Qwen/Qwen3.5-0.8B on A100, tp=1, FLASH_ATTN: block 544 tokens'``."""
    dcp = plan.decode_context_parallel_size
    dcp = f", dcp={dcp}" if dcp > 1 else ""
    return (
        f"{plan_head(plan)}{dcp}, "
        f"{plan.attention_backend or 'no attention backend'}: block {plan.block_size} tokens, "
        f"kernel blocks {list(plan.kernel_block_sizes)}"
    )


def plan_text(plan) -> str:
    """``Plan.text()``: the header, the key numbers, the groups and the
    derivation of every size (what ``kvexplore plan`` prints); when vLLM
    would refuse to start it, every start-up check's verdict and the way out
    (``Plan.way_out``)."""
    lines = [repr(plan), "", plan.summary.to_string(index=False), "", "KV cache groups:",
             plan.group_table.to_string(index=False), "", "derivation:", plan.explain()]
    if plan.admission is not None and not plan.admission.ok:
        lines += ["", "start-up checks:",
                  *(f"  {c.summary()}" for c in plan.admission.checks), "",
                  "way out (each planned):",
                  *(f"  {w.text()}" for w in plan.way_out())]
    return "\n".join(lines)


def plan_figure(plan, *, registration: str = "unified"):
    """A plan at a glance (``Plan.figure()``): one row per KV cache group, the
    page of the group's first layer, all on one byte axis."""
    pages = plan_pages(plan, registration=registration)
    names = [group_label(plan, g) for g in plan.groups]
    fig = pages_figure(plan_title(plan), names, pages)
    return fig


@dataclass(frozen=True)
class BufferRow:
    """One backing buffer (unified: one ``KVCacheTensor``'s placement; legacy:
    one per layer position) and the segments it is cut into."""

    name: str
    size: int
    offset: int
    detail: str
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class BufferLayout(Displayable):
    """How the backing buffers are shared: rows of layer/block segments."""

    plan_label: str
    registration: str
    layout: str
    num_blocks: int
    rows: tuple[BufferRow, ...]
    block_zoom: tuple[Segment, ...]
    zoom_label: str
    notes: tuple[str, ...]

    def __repr__(self) -> str:
        return self.text()


def _short(name: str, plan) -> str:
    """``"L3"`` for a target layer, ``"D0"`` for a drafter's layer."""
    parts = name.split(".")
    nums = [p for p in parts if p.isdigit()]
    draft = plan.drafter is not None and name in plan.drafter.layer_names
    return f"{'D' if draft else 'L'}{nums[-1]}" if nums else parts[-1]


def buffer_layout(plan, *, registration: str = "unified") -> BufferLayout:
    """How each backing buffer is shared by one layer of every group.

    Unified: one row per ``KVCacheTensor`` (placements in one backing
    allocation).  Legacy: one buffer per layer position ``j``, shared by
    layer ``j`` of every group.  An unknown ``registration`` raises
    ``KVExploreError``.
    """
    require_plan(plan)
    check_registration_name(registration)
    if registration == "unified":
        rows, zoom, zoom_label, notes = _unified_buffers(plan)
    else:
        rows, zoom, zoom_label, notes = _legacy_buffers(plan)
    label = f"{plan_head(plan)}, {plan.attention_backend}, block_size={plan.block_size}"
    return BufferLayout(label, registration, plan.kv_cache_layout.name, plan.num_blocks, tuple(rows),
                        tuple(zoom), zoom_label, tuple(notes))


def _block_zoom(start: int, stride: int, page: int, real: int, num_blocks: int, what: str) -> list[Segment]:
    """The first :data:`ZOOM_BLOCKS` pages from byte ``start``, ``stride`` apart:
    ``real`` bytes of ``what``, then the page's padding."""
    zoom = []
    for b in range(min(num_blocks, ZOOM_BLOCKS)):
        at = start + b * stride
        zoom.append(Segment(f"b{b}", at, real, "", what))
        if page > real:
            zoom.append(Segment("pad", at + real, page - real, "", "page padding"))
    return zoom


def _unified_buffers(plan):
    """One row per ``KVCacheTensor``, the zoom into tensor 0's first blocks."""
    nb = plan.num_blocks
    rows = []
    for ti, t in enumerate(plan.tensors):
        spec = plan.layer_specs[t.layers[0]]
        page, real = page_bytes(spec), real_page_bytes(spec)
        if t.layer_stride >= t.block_stride * nb:  # layer-compact: one run per layer
            segs = [Segment(f"{_short(lname, plan)}", t.offset + li * t.layer_stride, nb * t.block_stride, "",
                            f"{lname}: {nb} blocks x {t.block_stride:,} B") for li, lname in enumerate(t.layers)]
        else:
            segs = [Segment(f"b{b}", t.offset + b * t.block_stride, t.block_stride, "",
                            f"block {b}: {len(t.layers)} layers' pages") for b in range(nb)]
        pad = f", padding {page - real:,} B at the end of each page" if page > real else ""
        rows.append(BufferRow(
            f"tensor {ti} (group {group_of(plan, t.layers[0])}, {type(spec).__name__})", t.size, t.offset,
            f"{len(t.layers)} layers, layer_stride {t.layer_stride:,} B, block_stride "
            f"{t.block_stride:,} B, page {page:,} B{pad}",
            tuple(segs)))
    zoom, zoom_label, notes = [], "", []
    if plan.tensors:
        t = plan.tensors[0]
        spec = plan.layer_specs[t.layers[0]]
        zoom = _block_zoom(t.offset, t.block_stride, page_bytes(spec), real_page_bytes(spec), nb,
                           "state" if isinstance(spec, MambaSpec) else "K/V")
        zoom_label = f"first {min(nb, ZOOM_BLOCKS)} blocks of {t.layers[0]} (tensor 0)"
    ends = {t.offset + t.size for t in plan.tensors}
    if len(plan.tensors) > 1 and {t.offset for t in plan.tensors} == {0} and len(ends) == 1:
        notes.append(
            f"all {len(plan.tensors)} tensors overlay one backing buffer of "
            f"{max(ends):,} B: a block id belongs to one group at a time"
        )
    return rows, zoom, zoom_label, notes


def _legacy_buffers(plan):
    """One row per layer position, the zoom into a padded Mamba page."""
    groups, nb = plan.groups, plan.num_blocks
    width = max((len(g.layer_names) for g in groups), default=0)
    page = max((page_bytes(g.kv_cache_spec) for g in groups), default=0)
    rows = []
    for j in range(width):
        owners = [f"g{gid}:{_short(g.layer_names[j], plan)}" for gid, g in enumerate(groups) if j < len(g.layer_names)]
        segs = [Segment(f"b{b}", b * page, page, "", "one page per block") for b in range(nb)]
        rows.append(BufferRow(f"buffer {j}", page * nb, 0,
                              f"shared by {', '.join(owners)}; page {page:,} B, stride(0) {page:,} B",
                              tuple(segs)))
    zoom, zoom_label, notes = [], "", []
    for gid, g in enumerate(groups):
        real = real_page_bytes(g.kv_cache_spec)
        if isinstance(g.kv_cache_spec, MambaSpec) and real < page:
            if not zoom:
                zoom = _block_zoom(0, page, page, real, nb, "conv | ssm")
                zoom_label = f"first {min(nb, ZOOM_BLOCKS)} blocks of buffer 0 as group {gid} (Mamba) sees them"
            notes.append(f"group {gid}: conv | ssm | pad, {page - real:,} B padding per page")
    return rows, zoom, zoom_label, notes


def buffer_map_text(plan, *, registration: str = "unified") -> str:
    """Text form of :func:`buffer_map`."""
    return buffer_layout(plan, registration=registration).text()


def buffer_map(plan, *, registration: str = "unified"):
    """The buffer map as a matplotlib ``Figure``: one row per buffer, layers
    (or blocks) along the byte axis, and a zoom row with page padding."""
    return buffer_layout(plan, registration=registration).figure()


def sweep_table(df, x: str, y: str, value: str):
    """Pivot ``df`` to ``value`` over ``y`` (rows) x ``x`` (columns).

    ``value`` must be numeric or boolean (booleans become 0/1); exactly one
    row per ``(x, y)``: filter the other axes first.
    """
    if not isinstance(df, pd.DataFrame):
        raise KVExploreError(f"df is a {type(df).__name__}; expected the DataFrame of a sweep "
                             "(kvexplore.sweep or capacity_sweep)")
    for what, col in (("x", x), ("y", y), ("value", value)):
        if col not in df.columns:
            raise KVExploreError(f"{what}={col!r} is not a column of the sweep; expected one of {list(df.columns)}")
    series = df[value]
    if not (pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series)):
        numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c])]
        raise KVExploreError(
            f"value={value!r} has dtype {series.dtype}; expected a numeric or boolean "
            f"column such as {numeric}"
        )
    dup = df.duplicated([x, y]).sum()
    if dup:
        others = [c for c in df.columns if c not in (x, y, value)]
        raise KVExploreError(
            f"{dup} rows repeat an ({x}, {y}) pair, so {value!r} is ambiguous; filter the "
            f"other columns first (e.g. one of {others[:6]})"
        )
    data = df[[x, y, value]].copy()
    if pd.api.types.is_bool_dtype(series):
        data[value] = data[value].astype(int)
    return data.pivot(index=y, columns=x, values=value)


def sweep_context(df, x: str, y: str) -> str:
    """Whose answer a sweep is: its model and GPU when the axes do not vary
    them (``'Qwen/Qwen3.5-0.8B on A100'``; ``'2 gpus'`` when several); ``''``
    for a frame with neither column."""
    parts = []
    for col in ("model", "gpu"):
        if col not in df.columns or col in (x, y):
            continue
        values = df[col].dropna().unique()
        if len(values) == 1:
            parts.append(str(values[0]))
        elif len(values) > 1:
            parts.append(f"{len(values)} {col}s")
    return " on ".join(parts)


def sweep_heatmap(df, x: str, y: str, value: str):
    """Heatmap of a numeric or boolean sweep column over two axes; cells
    annotated with their values (missing combinations blank), titled with
    the model and GPU (:func:`sweep_context`)."""
    table = sweep_table(df, x, y, value)
    return sweep_figure(table, x, y, value, context=sweep_context(df, x, y))


def sweep_heatmap_text(df, x: str, y: str, value: str) -> str:
    """Text form of :func:`sweep_heatmap`: the pivot table under its title."""
    table = sweep_table(df, x, y, value)
    context = sweep_context(df, x, y)
    title = f"{value} over {y} (rows) x {x} (columns)" + (f", {context}" if context else "")
    return f"{title}\n{table.to_string(na_rep='-')}"


__all__ = [
    "BufferLayout",
    "BufferRow",
    "EditedSide",
    "PageLayout",
    "Segment",
    "buffer_layout",
    "buffer_map",
    "buffer_map_text",
    "page_layout",
    "page_map",
    "page_map_text",
    "plan_figure",
    "plan_pages",
    "plan_title",
    "resolve_layer",
    "sweep_heatmap",
    "sweep_heatmap_text",
    "sweep_table",
]
