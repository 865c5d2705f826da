"""Byte-exact proof that a store and a load through edited views lose nothing.

:func:`verify_roundtrip` plays what an LMCache-style connector does with the
result of :func:`kvexplore.apply_kv_cache_group_edits`, on the tensors'
own device:

1. *fill*: every selected block of every layer gets a recognisable pattern
   written through the **registered** views, region by region (conv / SSM
   state of a Mamba page, K / V of an attention page), so a byte that lands in
   the wrong place is seen as such;
2. *store / zero / load*: per layer, the selected blocks are gathered through
   the **edited** view into a separate buffer, zeroed through the edited view
   (every registered byte must now read 0: the view covers the layer), and
   scattered back from the buffer;
3. *compare*: every registered byte must hold its pattern again.

Groups are processed one at a time because vLLM overlays them on one backing
allocation (a block id belongs to one group at a time; Qwen3.5-0.8B's four
``KVCacheTensor`` each span the same 427,819,008 B).  Separately, address
arithmetic over sizes, strides and storage offsets proves that the edited
view of block ``i`` lies inside block ``i``'s page of that layer (its state
or K/V bytes plus its own page padding), and that no two pages of one group
overlap: no neighbour block, no sibling layer on the same buffer, no other
layer's padding.  The caches' previous contents are restored at the end
unless ``restore=False``.  Mismatches never raise: the report says where.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec, KVCacheSpecKind

from kvexplore.edits import (
    RegisteredKVCache,
    _check_caches,
    _kind,
    _page_bytes,
    _tensors_of,
)
from kvexplore.errors import KVExploreError

__all__ = ["RoundTripReport", "verify_roundtrip"]

# Pattern byte = 1 + (position + tag) mod 251: never 0 (so a zeroed byte is
# visible), shifted per block, per region and per layer by steps coprime with
# 251 so that a byte moved to a neighbour block, the other K/V half or a
# sibling layer no longer matches.
_MODULUS = 251
_BLOCK_STEP = 97
_REGION_STEP = 53
_LAYER_STEP = 37
_GROUP_STEP = 11

_COLUMNS = [
    "group",
    "layer",
    "edited",
    "regions",
    "blocks",
    "bytes",
    "roundtrip_ok",
    "mismatched_bytes",
    "first_mismatch",
    "covers_ok",
    "uncovered_bytes",
    "confined_ok",
    "disjoint_ok",
    "ok",
    "detail",
]


# --------------------------------------------------------------------------
# Address arithmetic
# --------------------------------------------------------------------------


def _block_runs(blocks: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Byte runs of each block of ``blocks`` (dim 0 = block), on the CPU.

    Returns ``(starts, run_bytes)``: ``starts`` is ``[num_blocks, runs]``
    absolute byte offsets into the untyped storage, every run ``run_bytes``
    long.  Dims are merged innermost-first while they are contiguous, so a
    dense page is one run (the Qwen3.5 attention block ``[2, 544, 1, 512]``
    bf16 is a single 1,114,112-byte run).
    """
    elem = blocks.element_size()
    dims = [
        (blocks.stride(d), blocks.shape[d])
        for d in range(1, blocks.ndim)
        if blocks.shape[d] != 1
    ]
    dims.sort(reverse=True)
    run = 1
    if dims and dims[-1][0] == 1:
        run = dims.pop()[1]
        while dims and dims[-1][0] == run:
            run *= dims.pop()[1]
    offsets = torch.zeros(1, dtype=torch.int64)
    for stride, size in dims:
        offsets = (offsets[:, None] + torch.arange(size) * stride).reshape(-1)
    base = blocks.storage_offset() + torch.arange(blocks.shape[0]) * blocks.stride(0)
    starts = (base[:, None] + offsets[None, :]) * elem
    return starts, run * elem


def _union_runs(
    parts: list[tuple[torch.Tensor, int]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``(starts, ends)`` per block of several run sets, coalesced reach.

    ``ends[b, k]`` is how far bytes stay continuously covered from
    ``starts[b, k]`` on (runs that touch or overlap are chained), which makes
    "is ``[s, e)`` covered" one ``searchsorted`` per query.
    """
    starts = torch.cat([s for s, _ in parts], dim=1)
    ends = torch.cat([s + n for s, n in parts], dim=1)
    order = starts.argsort(dim=1)
    starts = starts.gather(1, order)
    ends = ends.gather(1, order)
    reach = ends.cummax(dim=1).values
    # A new segment starts where a run begins after everything before it ends.
    new = torch.ones_like(starts, dtype=torch.bool)
    new[:, 1:] = starts[:, 1:] > reach[:, :-1]
    segment = new.cumsum(dim=1) - 1
    seg_end = torch.zeros_like(reach).scatter_reduce(
        1, segment, reach, reduce="amax", include_self=False
    )
    return starts, seg_end.gather(1, segment)


def _covered(
    outer: tuple[torch.Tensor, torch.Tensor], inner: list[tuple[torch.Tensor, int]]
) -> torch.Tensor:
    """Per block: is every ``inner`` run inside the union of ``outer`` runs?"""
    o_starts, o_reach = outer
    ok = torch.ones(o_starts.shape[0], dtype=torch.bool)
    for starts, length in inner:
        idx = torch.searchsorted(o_starts, starts.contiguous(), right=True) - 1
        found = idx >= 0
        reach = o_reach.gather(1, idx.clamp(min=0))
        ok &= (found & (reach >= starts + length)).all(dim=1)
    return ok


# --------------------------------------------------------------------------
# Per-layer plumbing
# --------------------------------------------------------------------------


def _as_bytes(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.element_size() == 1:
        return t.view(torch.uint8)
    if t.ndim and t.stride(-1) == 1:
        return t.view(torch.uint8)
    raise KVExploreError(
        f"{what} (shape {tuple(t.shape)}, strides {tuple(t.stride())}) has a "
        "strided last dim; expected stride 1 there to address its bytes"
    )


def _by_block(t: torch.Tensor, num_blocks: int, what: str) -> torch.Tensor:
    """``[num_blocks * r, ...]`` -> ``[num_blocks, r, ...]`` (a view)."""
    if t.ndim == 0 or num_blocks <= 0 or t.shape[0] % num_blocks:
        raise KVExploreError(
            f"{what} has shape {tuple(t.shape)}; expected a multiple of the "
            f"config's num_blocks={num_blocks} in dim 0"
        )
    return t.unflatten(0, (num_blocks, t.shape[0] // num_blocks))


def _state_names(count: int) -> list[str]:
    if count == 1:
        return ["conv"]
    return [f"conv{i}" if count > 2 else "conv" for i in range(count - 1)] + ["ssm"]


def _regions(
    spec: KVCacheSpec, value: RegisteredKVCache, num_blocks: int, name: str
) -> list[tuple[str, torch.Tensor]]:
    """Named byte views ``[num_blocks, ...]`` of a layer's registered data."""
    kind = _kind(spec)
    if not isinstance(value, torch.Tensor):
        names = _state_names(len(value))
        return [
            (label, _as_bytes(_by_block(t, num_blocks, f"layer {name!r}"), name))
            for label, t in zip(names, value, strict=True)
        ]
    blocks = _as_bytes(_by_block(value, num_blocks, f"layer {name!r}"), name)
    if kind == KVCacheSpecKind.MAMBA:
        sizes = [
            math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=False)
        ]
        row = blocks.shape[-1]
        if value.ndim == 4 and sum(sizes) == row:
            out, cursor = [], 0
            for label, size in zip(_state_names(len(sizes)), sizes, strict=True):
                out.append((label, blocks[..., cursor : cursor + size]))
                cursor += size
            return out
        return [("state", blocks)]
    head_size = getattr(spec, "head_size", None)
    head_size_v = getattr(spec, "head_size_v", 0) or 0
    if value.ndim == 5 and value.shape[1] == 2:  # legacy [P, 2, kb, H, D]
        return [("K", blocks[:, :, 0]), ("V", blocks[:, :, 1])]
    if (
        value.ndim == 4
        and head_size
        and head_size_v
        and getattr(spec, "state_content_bytes", None) is None
        and value.element_size() == torch.empty((), dtype=spec.dtype).element_size()
    ):
        k_bytes = head_size * value.element_size()
        if blocks.shape[-1] == k_bytes + head_size_v * value.element_size():
            return [("K", blocks[..., :k_bytes]), ("V", blocks[..., k_bytes:])]
    return [("latent" if kind == KVCacheSpecKind.MLA_ATTENTION else "kv", blocks)]


@dataclass
class _Layer:
    group: int
    index: int
    name: str
    spec: KVCacheSpec
    regions: list[tuple[str, torch.Tensor]]
    edited_parts: list[torch.Tensor]
    edited: bool
    row: dict = field(default_factory=dict)


_WIDE = (torch.int64, torch.int32, torch.int16)
#: Offsets into the ramp are multiples of 8 so pattern views can be read as
#: int64 words, and reduced modulo one period (8 x 251 bytes) per chunk.
_PERIOD = 8 * _MODULUS


def _widen(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same bytes as the widest integer dtype all ``tensors`` allow.

    Compares, fills and zero checks then touch 8x fewer elements; the bytes
    and the storage are unchanged (``Tensor.view(dtype)`` is a view).  All
    tensors get the same dtype, so a copy between them stays a byte copy.
    """
    for dtype in _WIDE:
        try:
            return tuple(t.view(dtype) for t in tensors)
        except RuntimeError:
            continue
    return tensors


def _expected(
    ramp: torch.Tensor, region: torch.Tensor, ordinal0: int, count: int, tag: int
) -> torch.Tensor:
    """Pattern of ``count`` selected blocks of a byte region: a view of ``ramp``.

    Byte ``p`` of selected block ``j`` is ``ramp[tag + 776 * j + p]``, i.e.
    ``1 + (tag + 776 j + p) mod 251``: never zero, and shifted by 23 per block
    so neighbours differ.
    """
    shape = tuple(region.shape[1:])
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    offset = (tag + 8 * _BLOCK_STEP * ordinal0) % _PERIOD
    return ramp.as_strided(
        (count, *shape), (8 * _BLOCK_STEP, *reversed(strides)), offset
    )


def _ramp(length: int, device: torch.device) -> torch.Tensor:
    length = -(-length // 8) * 8
    return (torch.arange(length, device=device) % _MODULUS + 1).to(torch.uint8)


def _chunks(blocks: list[int], step: int) -> list[tuple[int, slice]]:
    """Split the selection into runs of consecutive block ids, ``step`` at most.

    Returns ``(ordinal of the first block, slice of block ids)``: every
    operation then works on a plain slice view (``index_select`` on a strided
    view would first copy the whole layer).
    """
    out: list[tuple[int, slice]] = []
    lo = 0
    while lo < len(blocks):
        hi = lo + 1
        while hi < len(blocks) and hi - lo < step and blocks[hi] == blocks[hi - 1] + 1:
            hi += 1
        out.append((lo, slice(blocks[lo], blocks[hi - 1] + 1)))
        lo = hi
    return out


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------


class RoundTripReport:
    """Per-layer outcome of :func:`verify_roundtrip`, as a table.

    ``table`` has one row per layer: whether every byte came back
    (``roundtrip_ok``, ``mismatched_bytes``, ``first_mismatch`` as
    ``(block, region, byte)``), whether zeroing through the edited view
    cleared every registered byte (``covers_ok``), whether the edited view of
    each block stays inside that block's page of the layer (``confined_ok``)
    and whether the group's pages overlap nowhere (``disjoint_ok``).
    ``ok`` is the conjunction over all layers.
    """

    def __init__(self, table: pd.DataFrame, seconds: float, device: str) -> None:
        self.table = table
        self.seconds = seconds
        self.device = device

    @property
    def ok(self) -> bool:
        return bool(self.table["ok"].all()) if len(self.table) else True

    @property
    def bytes_checked(self) -> int:
        return int(self.table["bytes"].sum()) if len(self.table) else 0

    def by_group(self) -> pd.DataFrame:
        """One row per group: layers, bytes, and whether all of them passed."""
        return (
            self.table.groupby("group", sort=True)
            .agg(layers=("layer", "count"), bytes=("bytes", "sum"), ok=("ok", "all"))
            .reset_index()
        )

    def failures(self) -> pd.DataFrame:
        return self.table[~self.table["ok"]]

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"FAILED on {len(self.failures())} layer(s)"
        return (
            f"RoundTripReport({verdict}: {len(self.table)} layers, "
            f"{self.bytes_checked} bytes on {self.device})"
        )

    def __repr__(self) -> str:
        columns = ["group", "layer", "regions", "blocks", "bytes", "ok", "detail"]
        if self.table.empty:
            return self.summary()
        return self.summary() + "\n" + self.table[columns].to_string(index=False)

    def _repr_html_(self) -> str:
        from html import escape

        table = self.table.to_html(index=False, na_rep="-", escape=True)
        return f"<div><p><b>{escape(self.summary())}</b></p>{table}</div>"


# --------------------------------------------------------------------------
# verify_roundtrip
# --------------------------------------------------------------------------


def _selection(blocks: object, num_blocks: int) -> list[int]:
    if blocks is None:
        return list(range(num_blocks))
    if isinstance(blocks, torch.Tensor):
        blocks = blocks.tolist()
    if isinstance(blocks, range) and blocks.step == 1:
        chosen = list(blocks)
    elif isinstance(blocks, Sequence) and not isinstance(blocks, (str, bytes)):
        chosen = list(blocks)
    else:
        raise KVExploreError(
            f"blocks is a {type(blocks).__name__}; expected None or a sequence of "
            f"block ids in [0, {num_blocks})"
        )
    bad = [b for b in chosen if not isinstance(b, int) or not 0 <= b < num_blocks]
    if bad or len(set(chosen)) != len(chosen) or not chosen:
        raise KVExploreError(
            f"blocks={chosen[:8]} holds {bad[:4] or 'duplicates or nothing'}; "
            f"expected distinct block ids in [0, {num_blocks})"
        )
    return chosen


def _prepare(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
) -> list[_Layer]:
    where = _check_caches(kv_cache_config, kv_caches)
    if not isinstance(edited, Mapping) or set(edited) != set(kv_caches):
        got = sorted(edited) if isinstance(edited, Mapping) else type(edited).__name__
        raise KVExploreError(
            f"edited holds {got!s:.200}; expected exactly the layers of kv_caches "
            "(pass the result of apply_kv_cache_group_edits)"
        )
    num_blocks = kv_cache_config.num_blocks
    layers: list[_Layer] = []
    per_group: dict[int, int] = {}
    for name, value in kv_caches.items():
        group, spec = where[name]
        assert group is not None and spec is not None  # config given
        new = edited[name]
        parts = (
            _tensors_of(new) if isinstance(new, (torch.Tensor, list, tuple)) else None
        )
        if not parts or not all(isinstance(t, torch.Tensor) for t in parts):
            raise KVExploreError(
                f"edited[{name!r}] is a {type(new).__name__}; expected a tensor or "
                "a list of tensors"
            )
        device = _tensors_of(value)[0].device
        if any(t.device != device for t in parts):
            raise KVExploreError(
                f"edited[{name!r}] is on {parts[0].device}, the registered cache on "
                f"{device}; expected the same device"
            )
        index = per_group.get(group, 0)
        per_group[group] = index + 1
        layers.append(
            _Layer(
                group=group,
                index=index,
                name=name,
                spec=spec,
                regions=_regions(spec, value, num_blocks, name),
                edited_parts=[
                    _by_block(t, num_blocks, f"edited[{name!r}]") for t in parts
                ],
                edited=new is not value,
            )
        )
    return layers


def _analyse(layers: list[_Layer], idx: torch.Tensor, num_blocks: int) -> None:
    """Address arithmetic: coverage, confinement, disjoint pages (CPU only)."""
    pages: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
    for li, layer in enumerate(layers):
        storage = layer.regions[0][1].untyped_storage().data_ptr()
        reg_runs = [_block_runs(r) for _, r in layer.regions]
        edit_runs = [_block_runs(e) for e in layer.edited_parts]
        same_storage = all(
            e.untyped_storage().data_ptr() == storage for e in layer.edited_parts
        )
        reg_union = _union_runs(reg_runs)
        first = reg_union[0][:, 0]
        hull = reg_union[1].amax(dim=1) - first
        page = _page_bytes(layer.spec)
        paged = bool((hull <= page).all())
        if paged:
            page_start, page_end = first, first + page
            pages.setdefault((layer.group, storage), []).append(
                (page_start, page_end, li)
            )
        else:
            # No single page interval (e.g. heads outside blocks): the layer's
            # bytes of a block are exactly its registered runs.
            for starts, length in reg_runs:
                pages.setdefault((layer.group, storage), []).append(
                    (starts.reshape(-1), starts.reshape(-1) + length, li)
                )
        covers = _covered(_union_runs(edit_runs), reg_runs)[idx]
        if paged:
            e_lo = torch.cat([s for s, _ in edit_runs], 1).amin(1)
            e_hi = torch.cat([s + n for s, n in edit_runs], 1).amax(1)
            confined = (e_lo >= page_start) & (e_hi <= page_end)
        else:
            confined = _covered(reg_union, edit_runs)
        confined = confined[idx] & same_storage
        notes = []
        if not same_storage:
            notes.append("edited view is over other storage (a copy?)")
        if not bool(covers.all()):
            bad = idx[~covers][:4].tolist()
            notes.append(f"edited view misses registered bytes of blocks {bad}")
        if not bool(confined.all()):
            bad = idx[~confined][:4].tolist()
            notes.append(f"edited view leaves its page in blocks {bad}")
        layer.row.update(
            covers_ok=bool(covers.all()),
            confined_ok=bool(confined.all()),
            disjoint_ok=True,
            notes=notes,
        )
    for entries in pages.values():
        starts = torch.cat([s for s, _, _ in entries])
        ends = torch.cat([e for _, e, _ in entries])
        owner = torch.cat([torch.full_like(s, li) for s, _, li in entries])
        block = torch.cat([torch.arange(s.numel()) % num_blocks for s, _, _ in entries])
        order = starts.argsort()
        starts, ends, owner, block = (
            starts[order],
            ends[order],
            owner[order],
            block[order],
        )
        reach = ends.cummax(0).values
        clash = torch.nonzero(starts[1:] < reach[:-1]).reshape(-1)
        for k in clash[:16].tolist():
            a, b = owner[k + 1].item(), owner[k].item()
            for li, other in ((a, b), (b, a)):
                layers[li].row["disjoint_ok"] = False
                layers[li].row["notes"].append(
                    f"page of block {block[k + 1 if li == a else k].item()} overlaps "
                    f"{layers[other].name!r}"
                )


def _snapshot(
    layers: list[_Layer], chunks: list[tuple[int, slice]], everything: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the bytes the fill will overwrite, to put back afterwards.

    With every block selected, one copy of each storage's touched span is
    cheapest (overlaid groups share it); otherwise the selected blocks of each
    registered region.  The store / zero / load cycle restores the edited
    views' other bytes (page padding) by itself.
    """
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if everything:
        spans: dict[int, tuple[torch.Tensor, int, int]] = {}
        for layer in layers:
            for t in [r for _, r in layer.regions] + layer.edited_parts:
                key = t.untyped_storage().data_ptr()
                lo = t.storage_offset() * t.element_size()
                reach = sum(
                    (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n
                )
                hi = lo + (reach + 1) * t.element_size()
                base, a, b = spans.get(key, (t, lo, hi))
                spans[key] = (base, min(a, lo), max(b, hi))
        for base, lo, hi in spans.values():
            raw = torch.empty(0, dtype=torch.uint8, device=base.device).set_(
                base.untyped_storage(), lo, (hi - lo,), (1,)
            )
            (wide,) = _widen(raw)
            saved.append((wide, wide.clone()))
        return saved
    for layer in layers:
        for _, region in layer.regions:
            for _, chunk in chunks:
                saved.append((region[chunk], region[chunk].clone()))
    return saved


def verify_roundtrip(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
    *,
    blocks: Sequence[int] | None = None,
    restore: bool = True,
    chunk_bytes: int = 64 << 20,
) -> RoundTripReport:
    """Store and load every selected block through ``edited`` and check every byte.

    Args:
        kv_cache_config: the vLLM ``KVCacheConfig`` the caches were built for
            (groups, per-layer specs, ``num_blocks``).
        kv_caches: the registered caches (what vLLM hands a connector).
        edited: the edited mapping, e.g. :func:`apply_kv_cache_group_edits`'s
            result; unedited layers may be the registered objects themselves.
        blocks: block ids to exercise; ``None`` for all ``num_blocks``.
        restore: put the caches' previous bytes back at the end (one extra
            copy of the touched span); ``False`` leaves the patterns.
        chunk_bytes: upper bound of the separate store buffer per step.

    Returns:
        :class:`RoundTripReport`; a mismatch is reported, not raised.

    Raises:
        ValueError: inputs that do not describe one registration (missing or
            extra layers, mixed devices, leading dims that are not whole
            blocks, an unusable ``blocks``).
    """
    import time

    if kv_cache_config is None or not hasattr(kv_cache_config, "num_blocks"):
        raise KVExploreError(
            f"kv_cache_config is {type(kv_cache_config).__name__}; expected the "
            "vLLM KVCacheConfig the caches were built for"
        )
    started = time.perf_counter()
    num_blocks = int(kv_cache_config.num_blocks)
    chosen = _selection(blocks, num_blocks)
    layers = _prepare(kv_cache_config, kv_caches, edited)
    if not layers:
        return RoundTripReport(pd.DataFrame(columns=_COLUMNS), 0.0, "cpu")
    device = layers[0].regions[0][1].device
    _analyse(layers, torch.tensor(chosen, dtype=torch.int64), num_blocks)

    per_block = max(
        sum(math.prod(t.shape[1:]) * t.element_size() for t in layer.edited_parts)
        for layer in layers
    )
    step = max(1, min(4096, chunk_bytes // max(per_block, 1)))
    region_bytes = max(
        math.prod(r.shape[1:]) for layer in layers for _, r in layer.regions
    )
    ramp = _ramp(region_bytes + _PERIOD + 8 * _BLOCK_STEP * step, device)
    chunks = _chunks(chosen, step)
    saved = _snapshot(layers, chunks, len(chosen) == num_blocks) if restore else []
    try:
        _exercise(layers, chunks, ramp)
    finally:
        for target, copy in reversed(saved):
            target.copy_(copy)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _report(layers, len(chosen), time.perf_counter() - started, device)


def _store_zero_load(layer: _Layer, chunk: slice, scratch: torch.Tensor) -> int:
    """One store and load of ``chunk`` through the edited view.

    Returns how many registered bytes were still non-zero after zeroing
    through the edited view (0 when the view covers the layer).  The store
    goes to ``scratch``, a separate buffer allocated once per call (a fresh
    allocation per chunk would pay page faults on every store).
    """
    buffers, cursor = [], 0
    for e in layer.edited_parts:
        part = e[chunk]
        nbytes = part.numel() * part.element_size()
        buf = scratch[cursor : cursor + nbytes].view(part.dtype).view(part.shape)
        buf.copy_(part)  # the store
        buffers.append(buf)
        cursor += -(-nbytes // 16) * 16
    for e in layer.edited_parts:
        e[chunk].zero_()
    uncovered = 0
    for _, region in layer.regions:
        (part,) = _widen(region[chunk])
        if bool(part.any()):
            uncovered += int(part.reshape(-1).view(torch.uint8).count_nonzero())
    for e, buf in zip(layer.edited_parts, buffers, strict=True):  # the load
        e[chunk].copy_(buf)
    return uncovered


def _exercise(
    layers: list[_Layer], chunks: list[tuple[int, slice]], ramp: torch.Tensor
) -> None:
    """Fill, store / zero / load and compare, one group at a time."""
    most = max(chunk.stop - chunk.start for _, chunk in chunks)
    scratch = torch.empty(
        max(
            sum(
                -(-math.prod(e.shape[1:]) * e.element_size() * most // 16) * 16
                for e in layer.edited_parts
            )
            for layer in layers
        ),
        dtype=torch.uint8,
        device=ramp.device,
    )
    for group in sorted({layer.group for layer in layers}):
        members = [layer for layer in layers if layer.group == group]
        tags: dict[tuple[str, int], int] = {}
        for layer in members:  # 1. fill through the registered views
            for k, (_, region) in enumerate(layer.regions):
                tag = 8 * (
                    (_GROUP_STEP * group + _LAYER_STEP * layer.index + _REGION_STEP * k)
                    % _MODULUS
                )
                tags[(layer.name, k)] = tag
                for lo, chunk in chunks:
                    pattern = _expected(ramp, region, lo, chunk.stop - chunk.start, tag)
                    dst, src = _widen(region[chunk], pattern)
                    dst.copy_(src)
        for layer in members:  # 2. store, zero, load through the edited view
            uncovered = 0
            try:
                for _, chunk in chunks:
                    uncovered += _store_zero_load(layer, chunk, scratch)
            except RuntimeError as exc:  # e.g. an expanded view torch cannot write
                layer.row["covers_ok"] = False
                layer.row["notes"].append(
                    f"edited view cannot be stored/loaded: {str(exc).splitlines()[0]}"
                )
            layer.row["uncovered_bytes"] = uncovered
            if uncovered:
                layer.row["covers_ok"] = False
                layer.row["notes"].append(
                    f"{uncovered} registered bytes survived zeroing via the edited view"
                )
        for layer in members:  # 3. compare every registered byte
            mismatched, first, total = 0, None, 0
            for k, (label, region) in enumerate(layer.regions):
                for lo, chunk in chunks:
                    actual = region[chunk]
                    n = actual.shape[0]
                    pattern = _expected(ramp, region, lo, n, tags[(layer.name, k)])
                    total += actual.numel()
                    if torch.equal(*_widen(actual, pattern)):
                        continue
                    diff = actual != pattern
                    mismatched += int(diff.sum())
                    if first is None:
                        where = torch.nonzero(diff.reshape(n, -1))[0].tolist()
                        first = (chunk.start + where[0], label, where[1])
            layer.row.update(
                bytes=total,
                roundtrip_ok=mismatched == 0,
                mismatched_bytes=mismatched,
                first_mismatch=first,
            )
            if mismatched and first is not None:
                layer.row["notes"].append(
                    f"{mismatched} bytes differ after the round trip; first at "
                    f"block {first[0]}, {first[1]} byte {first[2]}"
                )


def _report(
    layers: list[_Layer], count: int, seconds: float, device: torch.device
) -> RoundTripReport:
    rows = []
    for layer in layers:
        row = layer.row
        ok = (
            row["roundtrip_ok"]
            and row["covers_ok"]
            and row["confined_ok"]
            and row["disjoint_ok"]
        )
        rows.append(
            {
                "group": layer.group,
                "layer": layer.name,
                "edited": layer.edited,
                "regions": ",".join(label for label, _ in layer.regions),
                "blocks": count,
                "bytes": row["bytes"],
                "roundtrip_ok": row["roundtrip_ok"],
                "mismatched_bytes": row["mismatched_bytes"],
                "first_mismatch": row["first_mismatch"],
                "covers_ok": row["covers_ok"],
                "uncovered_bytes": row["uncovered_bytes"],
                "confined_ok": row["confined_ok"],
                "disjoint_ok": row["disjoint_ok"],
                "ok": bool(ok),
                "detail": "; ".join(row["notes"]) or "every byte came back",
            }
        )
    return RoundTripReport(pd.DataFrame(rows, columns=_COLUMNS), seconds, str(device))
