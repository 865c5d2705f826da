"""Byte-exact proof that a store and a load through edited views lose nothing.

:func:`verify_roundtrip` plays what an LMCache-style connector does with the
result of :func:`kvexplore.apply_kv_cache_group_edits`, on the tensors'
own device:

1. *fill*: every selected block of every layer gets a recognisable pattern
   written through the **registered** views (conv / SSM state of a Mamba
   page, K / V of an attention page), so a byte that lands in the wrong place
   is seen as such.  The pattern is a function of the byte's position in its
   page, its block and its layer, so regions that tile one contiguous span
   (conv then SSM; K and V interleaved per token) are filled as that span in
   one call and still differ from each other;
2. *store / zero / load*: per layer, the selected blocks are gathered through
   the **edited** view into a separate buffer, zeroed through the edited view
   and scattered back from the buffer;
3. *compare*: every registered byte must hold its pattern again.

Steps 1-3 run on tiles small enough to stay in cache (``chunk_bytes``): a run
of consecutive blocks times a window of layer positions, every group in turn
within a tile, so only the first pass over a tile comes from memory; with
``restore`` the tile's previous bytes are saved before and put back after,
also while in cache.  Layers of a group that vLLM places at a fixed stride
(the unified registration's ``layer_stride``) are handled as one strided
view, one torch call per step for all of them.  Data checks are thus local
to a tile: a layer overlapping another layer's page in a *later* tile is
caught by the address arithmetic (``disjoint_ok``), not by a mismatch.

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
contents are restored (tile by tile) unless ``restore=False``. Mismatches
never raise: the report says where.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec, KVCacheSpecKind

from kvexplore.editing.rules import (
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
    #: what the fill and the compare go through: the regions or one span
    fills: list[_Region] = field(default_factory=list)


_WIDE = (torch.int64, torch.int32, torch.int16)
#: Offsets into the ramp are multiples of 8 so pattern views can be read as
#: int64 words, and reduced modulo one period (8 x 251 bytes) per chunk.
_PERIOD = 8 * _MODULUS
#: Pattern shift from one selected block to the next (776 B = 23 mod 251).
_BLOCK_BYTES = 8 * _BLOCK_STEP
#: Pattern shift from one layer of a group to the next (296 B = 45 mod 251).
_LAYER_BYTES = 8 * _LAYER_STEP


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


def _pattern(
    ramp: torch.Tensor,
    like: torch.Tensor,
    tag: int,
    ordinal0: int,
    count: int,
    layers: int = 1,
) -> torch.Tensor:
    """Pattern ``[layers, count, *like.shape[1:]]``: a view of ``ramp``.

    ``like`` is a view ``[num_blocks, ...]`` of a layer's bytes as ``uint8``
    or a wider integer dtype, the dtype of ``ramp``.  The byte ``p`` bytes
    after the layer's block base (``tag`` includes the region's own offset
    from it) in selected block ``j`` of the ``l``-th layer of a stack is
    ``1 + (tag + 296 l + 776 j + p) mod 251``: never zero, shifted by 45 per
    layer and by 23 per block so that siblings and neighbours differ, and by
    position within the page so that regions differ (K from V, conv from SSM).
    Because the pattern depends on ``p`` modulo 251 only, the view takes
    ``like``'s strides modulo 8 x 251 bytes: it follows any layout with a
    ramp of a few KiB per dim.  It reads the same bytes whatever the dtype,
    so a word-wise compare is a byte-exact compare.
    """
    word = ramp.element_size()
    inner = [(d * word) % _PERIOD // word for d in like.stride()[1:]]
    offset = (tag + _BLOCK_BYTES * ordinal0) % _PERIOD
    return ramp.as_strided(
        (layers, count, *like.shape[1:]),
        (_LAYER_BYTES // word, _BLOCK_BYTES // word, *inner),
        offset // word,
    )


#: Rows :func:`_rows` aims for: long enough to stream, short enough that the
#: pattern of a multi-MiB page reads a ramp of a few hundred KiB at most.
_ROW_BYTES = (1 << 10, 16 << 10)


def _rows(view: torch.Tensor) -> torch.Tensor:
    """``view`` with a long contiguous last dim split into rows (a view).

    The pattern reads the ramp with the view's strides modulo 8 x 251 bytes
    (:func:`_pattern`), so a contiguous last dim of ``D`` words reads ``D``
    words of ramp, the whole 16.9 MB of a Nemotron-H state, while ``[D / R,
    R]`` reads about ``R + (D / R) x (R mod 2008)`` bytes.  Among the
    divisors ``R`` of ``D`` with rows of 1-16 KiB, the one that reads least
    is taken; the bytes, their order and the storage are unchanged.
    """
    if view.ndim < 2 or view.stride(-1) != 1:
        return view
    word, size = view.element_size(), view.shape[-1]
    if size * word <= _ROW_BYTES[1]:
        return view
    rows = _row_count(size, word, _pattern_bytes(view))
    return view if rows is None else view.unflatten(-1, (rows, size // rows))


@functools.lru_cache(maxsize=256)
def _row_count(size: int, word: int, reach: int) -> int | None:
    """The row count :func:`_rows` picks for a last dim of ``size`` words."""
    best = None
    fewest = max(2, -(-size * word // _ROW_BYTES[1]))
    for rows in range(fewest, size * word // _ROW_BYTES[0] + 1):
        if size % rows:
            continue
        row = size // rows
        cost = row * word + (rows - 1) * ((row * word) % _PERIOD)
        if cost < reach:
            best, reach = rows, cost
    return best


def _pattern_bytes(like: torch.Tensor) -> int:
    """Ramp bytes one block of :func:`_pattern` over ``like`` reads past its offset."""
    word = like.element_size()
    return word + sum(
        (n - 1) * ((d * word) % _PERIOD)
        for n, d in zip(like.shape[1:], like.stride()[1:], strict=True)
    )


def _expected(
    ramp: torch.Tensor, region: torch.Tensor, ordinal0: int, count: int, tag: int
) -> torch.Tensor:
    """Pattern of ``count`` selected blocks of one layer's region ``[N, ...]``."""
    return _pattern(ramp, region, tag, ordinal0, count)[0]


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
        regions = _tagged(_regions(spec, value, num_blocks, name), group, index)
        layers.append(
            _Layer(
                group=group,
                index=index,
                name=name,
                spec=spec,
                regions=regions,
                edited_parts=[
                    _by_block(t, num_blocks, f"edited[{name!r}]") for t in parts
                ],
                edited=new is not value,
                fills=_fill_views(regions),
            )
        )
    return layers


def _tagged(
    named: list[tuple[str, torch.Tensor]], group: int, index: int
) -> list[_Region]:
    """The layer's regions with their pattern tags.

    A region's tag is the layer's tag plus the region's offset from the
    layer's first registered byte of block 0, so the pattern is a function of
    the byte's position in the page: K and V (or conv and SSM) differ because
    they sit at different offsets.  Regions on separate storages get
    distinct offsets instead.
    """
    base = _layer_tag(group, index)
    views = [view for _, view in named]
    storage = {v.untyped_storage().data_ptr() for v in views}
    if len(storage) == 1:
        first = min(v.storage_offset() for v in views)
        offsets = [v.storage_offset() - first for v in views]
    else:
        offsets = [8 * ((_REGION_STEP * k) % _MODULUS) for k in range(len(views))]
    return [
        _Region(label, _rows(view), _rows(_widest(view)), base + offset)
        for (label, view), offset in zip(named, offsets, strict=True)
    ]


def _fill_views(regions: list[_Region]) -> list[_Region]:
    """Views to fill and compare a layer through: its regions, or one span.

    When the regions of a block tile one contiguous byte range with neither
    gap nor overlap, on one storage and with one block stride (conv then SSM
    state of a Mamba page; K and V interleaved token by token in vLLM 0.33's
    attention page), that range is one view ``[num_blocks, span]``: it holds
    exactly the regions' bytes, and because the pattern depends on position
    only, filling it writes the very bytes the per-region fills would, in
    one streaming call instead of one per region (or per 128-byte K/V run).
    """
    if len(regions) < 2:
        return regions
    views = [r.view for r in regions]
    if (
        len({v.untyped_storage().data_ptr() for v in views}) != 1
        or len({v.stride(0) for v in views}) != 1
        or any(v.shape[0] != views[0].shape[0] for v in views)
    ):
        return regions
    runs = [_block_runs(v, torch.zeros(1, dtype=torch.int64)) for v in views]
    lo = min(int(starts.min()) for starts, _ in runs)
    hi = max(int(starts.max()) + length for starts, length in runs)
    total = sum(starts.numel() * length for starts, length in runs)
    if total != hi - lo or int(_union_bytes(runs)[0]) != total:
        return regions
    span = _storage_bytes(views[0]).as_strided(
        (views[0].shape[0], total), (views[0].stride(0), 1), lo
    )
    first = min(regions, key=lambda r: r.view.storage_offset())
    label = "+".join(r.label for r in regions)
    return [_Region(label, _rows(span), _rows(_widest(span)), first.tag)]


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


def _layer_tag(group: int, index: int) -> int:
    """Pattern offset of layer ``index`` of ``group`` (bytes).

    Linear in ``index`` (reduced modulo the period only when a view of the
    ramp is taken), so consecutive layers of a group read their patterns as
    one strided view of the ramp (see :class:`_Stack`).
    """
    return 8 * ((_GROUP_STEP * group) % _MODULUS) + _LAYER_BYTES * index


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
            shapes.append((key, t.storage_offset(), t.stride(0), _extent(t[0])))
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
            one tile at a time, while the tile is in cache: two more copies
            of each tile, into a buffer of one tile's size and back
            (``benchmarks/bench_edits.py`` measures both modes).
        chunk_bytes: how many bytes of one group one step works on (a tile:
            its layers in the window, every block of the chunk), which also
            bounds the separate store buffer; ``None`` picks 8 MiB on the CPU
            (tile and store buffer stay in the last-level cache while a
            6-layer group of 1 MiB pages still fits one tile; 2, 4 and 8 MiB
            measured in ``benchmarks/bench_edits.py``) or, on CUDA, 256 MiB,
            large enough that kernel launches do not dominate.  A tile holds
            at least one layer of one block.

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
    _exercise(layers, chosen, max(1, int(chunk_bytes)), restore)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _report(layers, len(chosen), time.perf_counter() - started, device)


def _block_bytes(layer: _Layer) -> int:
    """Bytes one block of ``layer`` needs in the store buffer (or compare)."""
    stored = sum(_aligned(e[0].numel() * e.element_size()) for e in layer.edited_parts)
    return max(stored, sum(f.view[0].numel() for f in layer.fills))


@dataclass
class _Stack:
    """Consecutive layers of one group whose views differ only by an offset.

    vLLM 0.33's unified registration places the layers of one
    ``KVCacheTensor`` ``layer_stride`` bytes apart
    (``vllm/v1/kv_cache_interface.py``, ``create_kv_cache_views``), so their
    registered regions, and the edited views made from them, are one view
    shifted by a constant.  A stack views them all at once with a leading
    layer dim, ``[L, num_blocks, ...]``: fill, store, zero, load and compare
    then cost one torch call per region for the whole stack instead of one
    per layer.  Layers are stacked only when each shift is at least one
    layer's whole extent, so a stacked call touches exactly the bytes the
    per-layer calls would; anything else (the legacy registration's separate
    tensors, views that overlap) is a stack of one.
    """

    layers: list[_Layer]
    fills: list[torch.Tensor]  # per fill view: [L, num_blocks, ...] (wide dtype)
    parts: list[torch.Tensor]  # per edited tensor: [L, num_blocks, ...]

    @classmethod
    def of(cls, layers: list[_Layer], shifts: list[int] | None) -> _Stack:
        first = layers[0]
        views = [f.wide for f in first.fills] + list(first.edited_parts)
        if shifts is None:
            stacked = [v.unsqueeze(0) for v in views]
        else:
            stacked = [
                v.as_strided(
                    (len(layers), *v.shape), (d, *v.stride()), v.storage_offset()
                )
                for v, d in zip(views, shifts, strict=True)
            ]
        count = len(first.fills)
        return cls(layers, stacked[:count], stacked[count:])

    @property
    def broken(self) -> bool:
        return self.layers[0].broken


def _extent(t: torch.Tensor) -> int:
    """Elements from ``t``'s first to its last addressed element, inclusive."""
    return sum((n - 1) * abs(d) for n, d in zip(t.shape, t.stride(), strict=True)) + 1


def _shifts(a: _Layer, b: _Layer) -> list[int] | None:
    """Per view, how far ``b``'s view lies past ``a``'s, when it is ``a``'s shifted.

    ``None`` unless every registered region and edited tensor of ``b`` is the
    same dtype, shape and strides on the same storage as ``a``'s, starting at
    least one whole extent after it (so the two never share a byte), and the
    pattern tags step by one layer.
    """
    if (
        a.broken
        or b.broken
        or len(a.fills) != len(b.fills)
        or len(a.edited_parts) != len(b.edited_parts)
        or any(
            rb.tag - ra.tag != _LAYER_BYTES
            for ra, rb in zip(a.fills, b.fills, strict=True)
        )
    ):
        return None
    out = []
    pairs = [(fa.wide, fb.wide) for fa, fb in zip(a.fills, b.fills, strict=True)]
    for x, y in pairs + list(zip(a.edited_parts, b.edited_parts, strict=True)):
        if (
            x.dtype != y.dtype
            or x.shape != y.shape
            or x.stride() != y.stride()
            or x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
        ):
            return None
        shift = y.storage_offset() - x.storage_offset()
        if shift < _extent(x):
            return None
        out.append(shift)
    return out


def _stacks(members: list[_Layer]) -> list[_Stack]:
    """The group's layers as maximal runs that one strided view covers."""
    if not members:
        return []
    out: list[_Stack] = []
    run, shifts = [members[0]], None
    for layer in members[1:]:
        step = _shifts(run[-1], layer)
        if step is not None and (shifts is None or step == shifts):
            run.append(layer)
            shifts = step
            continue
        out.append(_Stack.of(run, shifts))
        run, shifts = [layer], None
    out.append(_Stack.of(run, shifts))
    return out


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


class _Group:
    """One KV cache group's layers in a tile, as stacks, with their scratch views.

    The scratch buffer first takes the stores (every edited tensor of every
    stack, one after the other) and, once they are loaded back, the compare
    outputs (every fill view of every stack, one after the other), so one
    reduction over their union answers "did every byte come back?" for the
    group's share of the tile.  The views depend only on the number of
    blocks in the tile and are built once per number.
    """

    def __init__(self, members: list[_Layer], ne: bool) -> None:
        self.stacks = _stacks(members)
        self.ne = ne  # compare with ne + any (else xor + max)
        self._views: dict[int, tuple] = {}

    def scratch_bytes(self, n: int) -> int:
        """Scratch a chunk of ``n`` blocks needs, also once every stack is split."""
        singles = [_Stack.of([layer], None) for s in self.stacks for layer in s.layers]
        return max(self._need(self.stacks, n), self._need(singles, n))

    def _need(self, stacks: list[_Stack], n: int) -> int:
        stored = sum(
            _aligned(n * p[:, 0].numel() * p.element_size())
            for s in stacks
            for p in s.parts
        )
        compared = sum(
            _aligned(n * r[:, 0].numel() * (1 if self.ne else r.element_size()))
            for s in stacks
            for r in s.fills
        )
        return max(stored, compared)

    def views(self, n: int, scratch: torch.Tensor) -> tuple:
        """``(stores, outs, flat, gaps)`` for a chunk of ``n`` blocks.

        ``stores[i][j]``: the store buffer of part ``j`` of stack ``i``;
        ``outs[i][k]``: the compare output of region ``k`` of stack ``i``;
        ``flat``: all compare outputs as one tensor; ``gaps``: its bytes that
        belong to no output.
        """
        if n in self._views:
            return self._views[n]
        stores, cursor = [], 0
        for s in self.stacks:
            row = []
            for p in s.parts:
                shape = (p.shape[0], n, *p.shape[2:])
                nbytes = math.prod(shape) * p.element_size()
                row.append(scratch[cursor : cursor + nbytes].view(p.dtype).view(shape))
                cursor += _aligned(nbytes)
            stores.append(row)
        # Compare outputs back to back (aligned to their element size only),
        # so one reduction over ``flat`` covers them; the rare gap between
        # two of them is zeroed before each reduction (it holds store bytes).
        outs, cursor, gaps = [], 0, []
        for s in self.stacks:
            row = []
            for r in s.fills:
                shape = (r.shape[0], n, *r.shape[2:])
                dtype = torch.bool if self.ne else r.dtype
                word = 1 if self.ne else r.element_size()
                start = -(-cursor // word) * word
                if start > cursor:
                    gaps.append(scratch[cursor:start])
                nbytes = math.prod(shape) * word
                row.append(scratch[start : start + nbytes].view(dtype).view(shape))
                cursor = start + nbytes
            outs.append(row)
        flat = scratch[:cursor].view(torch.bool) if self.ne else scratch[:cursor]
        self._views[n] = stores, outs, flat, gaps
        return self._views[n]

    def split(self, stack: _Stack) -> None:
        """Replace ``stack`` by one stack per layer (a stacked call raised)."""
        at = self.stacks.index(stack)
        self.stacks[at : at + 1] = [_Stack.of([layer], None) for layer in stack.layers]
        self._views.clear()

    def cycle(self, lo: int, chunk: slice, ramps: dict, scratch: torch.Tensor) -> None:
        """Fill, store / zero / load and compare ``chunk`` for this group."""
        while not self._cycle(lo, chunk, ramps, scratch):
            pass

    def _cycle(self, lo: int, chunk: slice, ramps: dict, scratch: torch.Tensor) -> bool:
        n = chunk.stop - chunk.start
        stores, outs, flat, gaps = self.views(n, scratch)
        # 1. fill through the registered views
        work = []
        for s, stack in enumerate(self.stacks):
            for k, view in enumerate(stack.fills):
                actual = view[:, chunk]
                expected = _pattern(
                    ramps[actual.dtype],
                    view[0],
                    stack.layers[0].fills[k].tag,
                    lo,
                    n,
                    actual.shape[0],
                )
                actual.copy_(expected)
                work.append((actual, expected, outs[s][k]))
        # 2. store, zero, load through the edited views
        for s, stack in enumerate(self.stacks):
            if not _store_zero_load(stack, chunk, stores[s]):
                self.split(stack)
                return False
        # 3. every byte back?  One reduction over all compare outputs.
        if not work:
            return True
        for actual, expected, out in work:
            if actual.numel():
                if self.ne:
                    torch.ne(actual, expected, out=out)
                else:
                    torch.bitwise_xor(actual, expected, out=out)
        for gap in gaps:
            gap.zero_()
        if bool(flat.any()) if self.ne else bool(flat.max()):
            for stack in self.stacks:
                for layer in stack.layers:
                    for k in range(len(layer.regions)):
                        _locate(layer, k, lo, chunk, ramps)
        return True


def _store_zero_load(stack: _Stack, chunk: slice, buffers: list[torch.Tensor]) -> bool:
    """One store and load of ``chunk`` through the edited views of a stack.

    The store goes to ``buffers``, views of a separate buffer allocated once
    per call (a fresh allocation per chunk would pay page faults on every
    store).  No zero check follows the zeroing: :func:`_analyse` has proven,
    per block and byte-exact, that the edited view of each block covers every
    registered byte of that block on the same storage (``covers_ok``), so the
    zeroing reaches every byte the compare then reads, and a byte the load
    did not write back reads 0, never its (non-zero) pattern.

    Returns ``False`` when a stack of several layers raised (the caller redoes
    them one by one, so the error lands on the layer that caused it).
    """
    if stack.broken:
        return True
    try:
        parts = [e[:, chunk] for e in stack.parts]
        for part, buf in zip(parts, buffers, strict=True):
            buf.copy_(part)  # the store
        for part in parts:
            part.zero_()
        for part, buf in zip(parts, buffers, strict=True):  # the load
            part.copy_(buf)
    except RuntimeError as exc:  # e.g. an expanded view torch cannot write
        if len(stack.layers) > 1:
            return False
        layer = stack.layers[0]
        layer.broken = True
        layer.row["covers_ok"] = False
        layer.row["notes"].append(
            f"edited view cannot be stored/loaded: {str(exc).splitlines()[0]}"
        )
    return True


def _locate(layer: _Layer, k: int, lo: int, chunk: slice, ramps: dict) -> None:
    """Count and locate the bytes of region ``k`` of ``layer`` that differ."""
    n = chunk.stop - chunk.start
    r = layer.regions[k]
    actual = r.view[chunk]
    diff = actual != _expected(ramps[torch.uint8], actual, lo, n, r.tag)
    wrong = int(diff.sum())
    if not wrong:
        return
    layer.row["mismatched_bytes"] += wrong
    block, byte = torch.nonzero(diff.reshape(n, -1))[0].tolist()
    first = (chunk.start + block, r.label, byte)
    key = (lo + block, k, byte)
    if layer.row.get("_first_key") is None or key < layer.row["_first_key"]:
        layer.row["_first_key"], layer.row["first_mismatch"] = key, first


def _ne_compare(device: torch.device) -> bool:
    """Compare with ``ne`` + ``any`` (one output byte per word) off the CPU.

    On the CPU, ``xor`` + ``max`` over ``uint8`` streams faster.  Both are
    exact; tests run either on either device.
    """
    return device.type != "cpu"


def _tiling(members: dict[int, list[_Layer]], chunk_bytes: int) -> tuple[int, int]:
    """``(blocks per chunk, layers per window)`` so a tile fits ``chunk_bytes``.

    A tile is a run of consecutive blocks times a window of layer positions
    (the ``i``-th to ``j``-th layer of every group: vLLM overlays the
    ``i``-th layers of all groups on one ``KVCacheTensor``).  Small pages
    take whole groups and many blocks; a page so large that one block of a
    group exceeds the budget (Qwen3.5-0.8B: 6 layers x 1,114,112 B) takes one
    block and as many layers as fit, at least one.  ``members``: each
    group's layers, in order.
    """
    widest = max(len(m) for m in members.values())
    heaviest = max(sum(_block_bytes(layer) for layer in m) for m in members.values())
    if heaviest <= chunk_bytes:
        return min(4096, chunk_bytes // max(1, heaviest)), widest
    biggest = max(_block_bytes(layer) for m in members.values() for layer in m)
    window = max(1, chunk_bytes // max(1, biggest))
    return max(1, chunk_bytes // (biggest * window)), window


def _exercise(
    layers: list[_Layer], chosen: list[int], chunk_bytes: int, restore: bool
) -> None:
    """Fill, store / zero / load and compare: tile by tile, group by group.

    The outer loops run over tiles (see :func:`_tiling`) small enough to stay
    in cache; inside, each group in turn gets the whole cycle on the tile's
    layers (vLLM overlays groups on one backing allocation, so a group's fill
    overwrites the one before).  Every pass after the first then hits cache,
    and the tile's previous bytes are saved before and put back after, while
    hot.  Within a group, each :class:`_Stack` of layers is one torch call per
    fill view and step, and one reduction checks the whole group.

    Words are compared (8 bytes at a time where the layout allows): a word
    differs iff one of its bytes does.  On the CPU the words are ``xor``-ed
    into the (now free) store buffer and the largest byte of the result is
    taken (zero iff every byte matched): ``max`` over ``uint8`` streams about
    2.5x faster than ``count_nonzero`` and several times faster than
    ``torch.equal``.  On CUDA ``ne`` writes one byte per word and ``any``
    reduces it.  Only a group whose check fails is then compared byte by
    byte, layer by layer, to count and locate the damage.
    """
    device = layers[0].regions[0].view.device
    members: dict[int, list[_Layer]] = {}
    for layer in layers:
        members.setdefault(layer.group, []).append(layer)
        layer.row.update(mismatched_bytes=0, first_mismatch=None)
        layer.row["bytes"] = sum(r.view[0].numel() for r in layer.regions) * len(chosen)
    step, window = _tiling(members, chunk_bytes)
    chunks = _chunks(chosen, step)
    widest = max(len(m) for m in members.values())
    tiles = [
        [
            _Group(members[g][w : w + window], _ne_compare(device))
            for g in sorted(members)
        ]
        for w in range(0, widest, window)
    ]
    tiles = [[group for group in tile if group.stacks] for tile in tiles]
    groups = [group for tile in tiles for group in tile]
    most = max(chunk.stop - chunk.start for _, chunk in chunks)
    deepest = max(len(s.layers) for g in groups for s in g.stacks)
    reach = max(
        _pattern_bytes(v)
        for layer in layers
        for r in layer.regions + layer.fills
        for v in (r.view, r.wide)
    )
    ramp = _ramp(reach + _PERIOD + _BLOCK_BYTES * most + _LAYER_BYTES * deepest, device)
    ramps = {dtype: ramp.view(dtype) for dtype in (*_WIDE, torch.uint8)}
    scratch_bytes = _aligned(max(g.scratch_bytes(most) for g in groups))
    spans, span_bytes = [], 0
    if restore:
        for tile in tiles:
            tile_spans, tile_bytes = _spans(
                [layer for g in tile for s in g.stacks for layer in s.layers], chunks
            )
            spans.append(tile_spans)
            span_bytes = max(span_bytes, tile_bytes)
    # One allocation for the store buffer and the saved bytes.
    buffer = torch.empty(scratch_bytes + span_bytes, dtype=torch.uint8, device=device)
    scratch, saved = buffer[:scratch_bytes], buffer[scratch_bytes:]
    for c, (lo, chunk) in enumerate(chunks):
        for t, tile in enumerate(tiles):
            kept = []
            if restore:
                cursor = 0
                for flat, a, b in spans[t][c]:
                    keep = saved[cursor : cursor + b - a]
                    keep.copy_(flat[a:b])
                    kept.append((flat[a:b], keep))
                    cursor += b - a
            try:
                for group in tile:
                    group.cycle(lo, chunk, ramps, scratch)
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
