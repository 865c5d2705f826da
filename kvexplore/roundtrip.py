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
   and scattered back from the buffer;
3. *compare*: every registered byte must hold its pattern again.

Steps 1-3 run on chunks of consecutive blocks small enough to stay in cache
(``chunk_bytes``), every group in turn within a chunk, so only the first pass
over a chunk comes from memory; with ``restore`` the chunk's previous bytes
are saved before and put back after, also while in cache.  Data checks are
thus local to a chunk: a layer overlapping another layer's page in a *later*
chunk is caught by the address arithmetic (``disjoint_ok``), not by a
mismatch.

Groups are processed one at a time because vLLM overlays them on one backing
allocation (a block id belongs to one group at a time; Qwen3.5-0.8B's four
``KVCacheTensor`` each span the same 427,819,008 B). Separately, address
arithmetic over sizes, strides and storage offsets proves that the edited view
of block ``i`` covers every registered byte of block ``i`` on the same storage
(``covers_ok``, exact to the byte: ``uncovered_bytes`` counts the misses), so
the zeroing reaches every byte the compare reads and a byte the load failed to
write back reads 0, never its non-zero pattern; that it lies inside block
``i``'s page of that layer (its state or K/V bytes plus its own page padding),
and that no two pages of one group overlap: no neighbour block, no sibling
layer on the same buffer, no other layer's padding. The caches' previous
contents are restored (chunk by chunk) unless ``restore=False``. Mismatches
never raise: the report says where.
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


def _block_runs(blocks: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Byte runs of blocks ``which`` of ``blocks`` (dim 0 = block), on the CPU.

    Returns ``(starts, run_bytes)``: ``starts`` is ``[len(which), runs]``
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
    base = blocks.storage_offset() + which * blocks.stride(0)
    starts = (base[:, None] + offsets[None, :]) * elem
    return starts, run * elem


def _union_bytes(parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Per row: how many distinct bytes the runs of ``parts`` cover together.

    Runs sorted by start: run ``i`` adds ``max(0, end_i - max(start_i,
    reach_{i-1}))`` where ``reach`` is the furthest end so far (the run that
    reaches it starts no later than run ``i``, so it covers
    ``[start_i, reach_{i-1})``).
    """
    starts = torch.cat([s for s, _ in parts], dim=1)
    ends = torch.cat([s + n for s, n in parts], dim=1)
    order = starts.argsort(dim=1)
    starts = starts.gather(1, order)
    ends = ends.gather(1, order)
    reach = ends.cummax(dim=1).values
    before = torch.cat([starts[:, :1], reach[:, :-1]], dim=1)
    return (ends - torch.maximum(starts, before)).clamp(min=0).sum(dim=1)


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
class _Region:
    """One registered region of a layer: its bytes, widened, and its pattern tag."""

    label: str
    view: torch.Tensor  # uint8 [num_blocks, ...]
    wide: torch.Tensor  # the same bytes as the widest integer dtype they allow
    tag: int = 0


@dataclass
class _Layer:
    group: int
    index: int
    name: str
    spec: KVCacheSpec
    regions: list[_Region]
    edited_parts: list[torch.Tensor]
    edited: bool
    row: dict = field(default_factory=dict)
    broken: bool = False  # the edited view raised on store / load


_WIDE = (torch.int64, torch.int32, torch.int16)
#: Offsets into the ramp are multiples of 8 so pattern views can be read as
#: int64 words, and reduced modulo one period (8 x 251 bytes) per chunk.
_PERIOD = 8 * _MODULUS
#: Pattern shift from one selected block to the next (776 B = 23 mod 251).
_BLOCK_BYTES = 8 * _BLOCK_STEP


def _widest(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as the widest integer dtype they allow (a view).

    Fills and compares then touch up to 8x fewer elements; the bytes and the
    storage are unchanged (``Tensor.view(dtype)`` on a last dim of stride 1).
    """
    for dtype in _WIDE:
        try:
            return t.view(dtype)
        except RuntimeError:
            continue
    return t


def _expected(
    ramp: torch.Tensor, region: torch.Tensor, ordinal0: int, count: int, tag: int
) -> torch.Tensor:
    """Pattern of ``count`` selected blocks of a region: a view of ``ramp``.

    ``region`` is a view ``[num_blocks, ...]`` of the region's bytes as
    ``uint8`` or a wider integer dtype; ``ramp`` is the same dtype.  Byte
    ``p`` of selected block ``j`` is ``1 + (tag + 776 j + p) mod 251``: never
    zero, and shifted by 23 per block so neighbours differ.  The returned view
    reads the same bytes whatever the dtype, so a word-wise compare is a
    byte-exact compare.
    """
    word = region.element_size()
    shape = tuple(region.shape[1:])
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    offset = (tag + _BLOCK_BYTES * ordinal0) % _PERIOD
    return ramp.as_strided(
        (count, *shape), (_BLOCK_BYTES // word, *reversed(strides)), offset // word
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
    ``(block, region, byte)``), whether the edited view of each block covers
    every registered byte of that block on the same storage (``covers_ok``,
    by address arithmetic; ``uncovered_bytes`` counts the misses), whether the edited view of
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
                regions=[
                    _Region(label, view, _widest(view), _tag(group, index, k))
                    for k, (label, view) in enumerate(
                        _regions(spec, value, num_blocks, name)
                    )
                ],
                edited_parts=[
                    _by_block(t, num_blocks, f"edited[{name!r}]") for t in parts
                ],
                edited=new is not value,
            )
        )
    return layers


def _analyse(layers: list[_Layer], idx: torch.Tensor, num_blocks: int) -> None:
    """Address arithmetic: coverage, confinement, disjoint pages (CPU only).

    Per selected block ``b`` and layer: ``uncovered`` is the number of
    registered bytes of ``b`` that the edited view of ``b`` does not touch
    (all of them when the view is over other storage), ``confined`` says the
    edited view of ``b`` stays inside ``b``'s page (or, without a page
    interval, inside ``b``'s registered bytes).  Block ``b``'s runs are block
    0's shifted by ``b * stride(0)`` of each view, so when every view of a
    layer has the same block step the relation is the same in every block and
    one block stands for all of them (exactly, not as a sample).
    """
    pages: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
    everyone = torch.arange(num_blocks)
    for li, layer in enumerate(layers):
        regions = [r.view for r in layer.regions]
        storage = regions[0].untyped_storage().data_ptr()
        same_storage = all(
            e.untyped_storage().data_ptr() == storage for e in layer.edited_parts
        )
        steps = {t.stride(0) * t.element_size() for t in regions + layer.edited_parts}
        uniform = len(steps) == 1
        which = idx[:1] if uniform else idx
        reg_runs = [_block_runs(r, which) for r in regions]
        edit_runs = [_block_runs(e, which) for e in layer.edited_parts]
        reg_bytes = _union_bytes(reg_runs)
        all_bytes = _union_bytes(reg_runs + edit_runs)
        # bytes of the registered union outside the edited union
        uncovered = all_bytes - _union_bytes(edit_runs) if same_storage else reg_bytes

        # Page intervals of every block (selected or not) for the disjointness
        # check, and whether the layer has one page interval per block.
        page = _page_bytes(layer.spec)
        reg_steps = {r.stride(0) * r.element_size() for r in regions}
        # Block b's runs are block 0's shifted by b * step when all regions
        # share one step: work on block 0 and shift.
        shift = reg_steps.pop() if len(reg_steps) == 1 else None
        runs0 = [
            _block_runs(r, torch.zeros(1, dtype=torch.int64) if shift else everyone)
            for r in regions
        ]
        first = torch.cat([s for s, _ in runs0], 1).amin(1)
        hull = torch.cat([s + n for s, n in runs0], 1).amax(1) - first
        if shift is not None:
            first = first + everyone * shift
        paged = bool((hull <= page).all())
        if paged:
            pages.setdefault((layer.group, storage), []).append(
                (first, first + page, li)
            )
            e_lo = torch.cat([s for s, _ in edit_runs], 1).amin(1)
            e_hi = torch.cat([s + n for s, n in edit_runs], 1).amax(1)
            confined = (e_lo >= first[which]) & (e_hi <= first[which] + page)
        else:
            # No single page interval (e.g. heads outside blocks): the layer's
            # bytes of a block are exactly its registered runs.
            if shift is not None:
                runs0 = [(s + everyone[:, None] * shift, n) for s, n in runs0]
            for starts, length in runs0:
                pages.setdefault((layer.group, storage), []).append(
                    (starts.reshape(-1), starts.reshape(-1) + length, li)
                )
            confined = all_bytes == reg_bytes
        confined = confined & same_storage
        covers = (uncovered == 0) & same_storage
        if uniform:  # block idx[0] stands for every selected block
            uncovered = uncovered.expand(idx.numel())
            covers, confined = covers.expand(idx.numel()), confined.expand(idx.numel())
        notes = []
        if not same_storage:
            notes.append("edited view is over other storage (a copy?)")
        if not bool(covers.all()):
            bad = idx[~covers][:4].tolist()
            notes.append(
                f"edited view misses registered bytes of blocks {bad} "
                f"({int(uncovered.sum())} bytes in all)"
            )
        if not bool(confined.all()):
            bad = idx[~confined][:4].tolist()
            notes.append(f"edited view leaves its page in blocks {bad}")
        layer.row.update(
            covers_ok=bool(covers.all()),
            uncovered_bytes=int(uncovered.sum()),
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


def _tag(group: int, index: int, k: int) -> int:
    """Pattern offset of region ``k`` of layer ``index`` of ``group`` (bytes)."""
    return 8 * (
        (_GROUP_STEP * group + _LAYER_STEP * index + _REGION_STEP * k) % _MODULUS
    )


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """All of ``t``'s untyped storage as one flat ``uint8`` tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _spans(
    layers: list[_Layer], chunks: list[tuple[int, slice]]
) -> tuple[list[list[tuple[torch.Tensor, int, int]]], int]:
    """Per chunk, the byte spans the fill overwrites, merged per storage.

    Only registered regions need saving: a store / zero / load through any
    view (page padding, a spill into a sibling, a neighbour block) puts back
    the very bytes it read, so it leaves memory as it found it.  Returns the
    spans of each chunk and the largest total.
    """
    flats: dict[int, torch.Tensor] = {}
    shapes = []
    for layer in layers:
        for r in layer.regions:
            t = r.view
            if t.numel() == 0:
                continue
            key = t.untyped_storage().data_ptr()
            if key not in flats:
                flats[key] = _storage_bytes(t)
            extent = (
                sum(
                    (n - 1) * s
                    for n, s in zip(t.shape[1:], t.stride()[1:], strict=True)
                )
                + 1
            )
            shapes.append((key, t.storage_offset(), t.stride(0), extent))
    out, most = [], 0
    for _, chunk in chunks:
        per: dict[int, list[tuple[int, int]]] = {}
        for key, off, step, extent in shapes:
            lo = off + chunk.start * step
            per.setdefault(key, []).append(
                (lo, lo + (chunk.stop - chunk.start - 1) * step + extent)
            )
        spans, total = [], 0
        for key, pieces in per.items():
            pieces.sort()
            cur_lo, cur_hi = pieces[0]
            for lo, hi in pieces[1:] + [(None, None)]:
                if lo is not None and lo <= cur_hi:
                    cur_hi = max(cur_hi, hi)
                    continue
                spans.append((flats[key], cur_lo, cur_hi))
                total += cur_hi - cur_lo
                if lo is not None:
                    cur_lo, cur_hi = lo, hi
        out.append(spans)
        most = max(most, total)
    return out, most


def verify_roundtrip(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
    *,
    blocks: Sequence[int] | None = None,
    restore: bool = True,
    chunk_bytes: int | None = None,
) -> RoundTripReport:
    """Store and load every selected block through ``edited`` and check every byte.

    Args:
        kv_cache_config: the vLLM ``KVCacheConfig`` the caches were built for
            (groups, per-layer specs, ``num_blocks``).
        kv_caches: the registered caches (what vLLM hands a connector).
        edited: the edited mapping, e.g. :func:`apply_kv_cache_group_edits`'s
            result; unedited layers may be the registered objects themselves.
        blocks: block ids to exercise; ``None`` for all ``num_blocks``.
        restore: put the caches' previous bytes back at the end; ``False``
            leaves the patterns.  The previous bytes are saved and put back
            one chunk at a time while the chunk is in cache, so this costs two
            cache-resident copies of each chunk, not a pass over memory.
        chunk_bytes: how many bytes of one group (all its layers, every
            block of the chunk) one step works on, which also bounds the
            separate store buffer; ``None`` picks a size that stays in the CPU
            caches (8 MiB) or, on CUDA, one large enough that kernel launches
            do not dominate (256 MiB).

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
    device = layers[0].regions[0].view.device
    _analyse(layers, torch.tensor(chosen, dtype=torch.int64), num_blocks)

    if chunk_bytes is None:
        chunk_bytes = (256 << 20) if device.type == "cuda" else (8 << 20)
    per_group: dict[int, int] = {}
    for layer in layers:
        per_group[layer.group] = per_group.get(layer.group, 0) + _block_bytes(layer)
    step = max(1, min(4096, chunk_bytes // max(1, *per_group.values())))
    region_bytes = max(r.view[0].numel() for layer in layers for r in layer.regions)
    ramp = _ramp(region_bytes + _PERIOD + _BLOCK_BYTES * step, device)
    chunks = _chunks(chosen, step)
    _exercise(layers, chunks, ramp, restore)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _report(layers, len(chosen), time.perf_counter() - started, device)


def _block_bytes(layer: _Layer) -> int:
    """Bytes one block of ``layer`` needs in the store buffer (or compare)."""
    stored = sum(
        -(-e[0].numel() * e.element_size() // 16) * 16 for e in layer.edited_parts
    )
    return max(stored, max(r.view[0].numel() for r in layer.regions))


def _store_zero_load(layer: _Layer, chunk: slice, scratch: torch.Tensor) -> None:
    """One store and load of ``chunk`` through the edited view.

    The store goes to ``scratch``, a separate buffer allocated once per call
    (a fresh allocation per chunk would pay page faults on every store).  No
    zero check follows the zeroing: :func:`_analyse` has proven, per block and
    byte-exact, that the edited view of each block covers every registered
    byte of that block on the same storage (``covers_ok``), so the zeroing
    reaches every byte the compare then reads, and a byte the load did not
    write back reads 0, never its (non-zero) pattern.
    """
    if layer.broken:
        return
    try:
        buffers, cursor = [], 0
        for e in layer.edited_parts:
            part = e[chunk]
            nbytes = part.numel() * part.element_size()
            buf = scratch[cursor : cursor + nbytes].view(part.dtype).view(part.shape)
            buf.copy_(part)  # the store
            buffers.append((part, buf))
            cursor += -(-nbytes // 16) * 16
        for part, _ in buffers:
            part.zero_()
        for part, buf in buffers:  # the load
            part.copy_(buf)
    except RuntimeError as exc:  # e.g. an expanded view torch cannot write
        layer.broken = True
        layer.row["covers_ok"] = False
        layer.row["notes"].append(
            f"edited view cannot be stored/loaded: {str(exc).splitlines()[0]}"
        )


def _compare(
    members: list[_Layer],
    lo: int,
    chunk: slice,
    ramps: dict[torch.dtype, torch.Tensor],
    scratch: torch.Tensor,
) -> None:
    """Check every registered byte of ``chunk`` of a group against its pattern.

    Words are compared (8 bytes at a time where the layout allows): a word
    differs iff one of its bytes does.  On the CPU ``xor`` into the (now free)
    store buffer and ``count_nonzero`` beat ``torch.equal``; on CUDA
    ``ne`` + ``any`` moves an eighth of the bytes a word-sized output would.
    All flags of the group come back in one host sync.  Only a mismatching
    region is then compared byte by byte to count and locate the damage.
    """
    n = chunk.stop - chunk.start
    flags, where = [], []
    cuda = scratch.device.type == "cuda"
    for layer in members:
        for k, r in enumerate(layer.regions):
            actual = r.wide[chunk]
            expected = _expected(ramps[actual.dtype], actual, lo, n, r.tag)
            if cuda:
                out = scratch[: actual.numel()].view(torch.bool).view(actual.shape)
                flags.append(torch.ne(actual, expected, out=out).any())
            else:
                nbytes = actual.numel() * actual.element_size()
                out = scratch[:nbytes].view(actual.dtype).view(actual.shape)
                flags.append(
                    torch.count_nonzero(torch.bitwise_xor(actual, expected, out=out))
                )
            where.append((layer, k, r))
            layer.row["bytes"] += r.view[0].numel() * n
    if not flags:
        return
    found = torch.stack(flags).tolist() if cuda else [int(f) for f in flags]
    for (layer, k, r), bad in zip(where, found, strict=True):
        if not bad:
            continue
        actual = r.view[chunk]
        diff = actual != _expected(ramps[torch.uint8], actual, lo, n, r.tag)
        layer.row["mismatched_bytes"] += int(diff.sum())
        block, byte = torch.nonzero(diff.reshape(n, -1))[0].tolist()
        first = (chunk.start + block, r.label, byte)
        key = (lo + block, k, byte)
        if layer.row.get("_first_key") is None or key < layer.row["_first_key"]:
            layer.row["_first_key"], layer.row["first_mismatch"] = key, first


def _exercise(
    layers: list[_Layer],
    chunks: list[tuple[int, slice]],
    ramp: torch.Tensor,
    restore: bool,
) -> None:
    """Fill, store / zero / load and compare: chunk by chunk, group by group.

    The outer loop runs over chunks of consecutive blocks small enough to
    stay in cache; inside, each group in turn gets the whole cycle (vLLM
    overlays groups on one backing allocation, so a group's fill overwrites
    the one before).  Every pass after the first then hits cache, and the
    chunk's previous bytes are saved before and put back after, while hot.
    """
    device = ramp.device
    ramps = {dtype: ramp.view(dtype) for dtype in (*_WIDE, torch.uint8)}
    groups: dict[int, list[_Layer]] = {}
    for layer in layers:
        groups.setdefault(layer.group, []).append(layer)
        layer.row.update(bytes=0, mismatched_bytes=0, first_mismatch=None)
    order = [groups[g] for g in sorted(groups)]
    most = max(chunk.stop - chunk.start for _, chunk in chunks)
    scratch = torch.empty(
        max(_block_bytes(layer) for layer in layers) * most + 16,
        dtype=torch.uint8,
        device=device,
    )
    spans, span_bytes = _spans(layers, chunks) if restore else ([], 0)
    saved = torch.empty(span_bytes, dtype=torch.uint8, device=device)
    for c, (lo, chunk) in enumerate(chunks):
        kept = []
        if restore:
            cursor = 0
            for flat, a, b in spans[c]:
                keep = saved[cursor : cursor + b - a]
                keep.copy_(flat[a:b])
                kept.append((flat[a:b], keep))
                cursor += b - a
        try:
            for members in order:
                for layer in members:  # 1. fill through the registered views
                    for r in layer.regions:
                        dst = r.wide[chunk]
                        dst.copy_(
                            _expected(ramps[dst.dtype], dst, lo, dst.shape[0], r.tag)
                        )
                for layer in members:  # 2. store, zero, load via the edited view
                    _store_zero_load(layer, chunk, scratch)
                _compare(members, lo, chunk, ramps, scratch)  # 3. every byte back?
        finally:
            for target, keep in kept:
                target.copy_(keep)
    for layer in layers:
        row = layer.row
        row.pop("_first_key", None)
        row["roundtrip_ok"] = row["mismatched_bytes"] == 0
        if row["mismatched_bytes"]:
            block, label, byte = row["first_mismatch"]
            row["notes"].append(
                f"{row['mismatched_bytes']} bytes differ after the round trip; "
                f"first at block {block}, {label} byte {byte}"
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
                "regions": ",".join(r.label for r in layer.regions),
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
