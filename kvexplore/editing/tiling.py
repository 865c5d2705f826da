"""The data half of the round-trip proof: fill, store, load elsewhere, compare.

What an LMCache-style connector does with the edited views (save a block,
free it, load the bytes back into another block), played on the tensors'
own device one cache-sized tile at a time:

1. *fill*: every selected block of every layer gets a recognisable pattern
   written through the **registered** views, so a byte that lands in the
   wrong place is seen as such.  The pattern is a function of the byte's
   position in its page, its block and its layer, so regions that tile one
   contiguous span (conv then SSM; K and V interleaved per token) are filled
   as that span in one call and still differ from each other;
2. *store / load*: through the **edited** views every selected block is
   moved some places on within the tile, cyclically (those that wrap
   through a separate buffer, the rest copied directly, see :func:`shift`;
   in a one-block tile the layers rotate instead).  Only when a tile holds
   one block of one layer is the load made to the same place, after the
   registered bytes are zeroed (the block was "evicted");
3. *compare*: every registered byte must hold the pattern of the block (or
   layer) it was stored from.  A registered byte the edited view misses
   keeps its own block's pattern, or zero, and is caught here; so is a
   view that puts a block's bytes at other offsets than it took them from.

A tile is a run of consecutive blocks times a window of layer positions
(``chunk_bytes`` bounds one group's share of it); every group in turn gets
steps 1-3 on the tile, because vLLM overlays the groups on one backing
allocation (Qwen3.5-0.8B's four ``KVCacheTensor`` each span the same
427,819,008 B), so only the first pass over a tile comes from memory.  A
group whose registered and edited views are, view for view, those of a
group already run on the tile (Qwen3.5's three Gated-DeltaNet groups) would
repeat the very same torch calls on the very same bytes: it is run once,
and each such group is reported what that run found (:func:`_distinct`).
The groups of a tile run largest fills first, and a group whose fill views
the group before it filled and compared (the attention page holds the
Gated-DeltaNet state of the same layer and block) starts from the pattern
that group left instead of filling again (:meth:`Group.inherits`).  With
``restore`` a tile runs on a replica of its own bytes: the same views,
offset for offset, on a buffer the size of the tile (:class:`_Replica`),
so the cache is never written and nothing has to be put back; where no
replica can stand for the tile, its bytes in the cache are saved before
and put back after, while in cache.  Layers of a group that vLLM
places at a fixed stride (``layer_stride``) are handled as one strided
view, one torch call per step for all of them.  Data checks are local to a
tile: a layer overlapping another layer's page in a *later* tile is caught
by the address arithmetic of :mod:`kvexplore.editing.proof`.

On the CPU, when pages are large (a mebibyte or more) and no byte is
written by two tiles (each on a replica of its own, or :func:`_disjoint`
in the cache), each of ``threads`` threads takes whole tiles, one after
the other, with its own buffers (:func:`_workers`); a tile's steps stay in
order within it.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kvexplore.editing.proof import (
    LayerUnderTest,
    Region,
    block_runs,
    storage_bytes,
    union_bytes,
)
from kvexplore.layout import cdiv, element_extent

__all__ = [
    "Group",
    "LayerDamage",
    "TiledLayer",
    "compare_kernel",
    "default_chunk_bytes",
    "exercise",
    "locate",
    "pattern_bytes",
    "split_rows",
]

# Pattern byte = 1 + (position + tag) mod 251: never 0 (so a zeroed byte is
# visible), shifted per block, per region and per layer by steps coprime with
# 251 so that a byte moved to a neighbour block, the other K/V half or a
# sibling layer no longer matches.  The ``i``-th layers of all groups (one
# ``KVCacheTensor`` in vLLM 0.33) get the same pattern, so a group whose
# views are its predecessor's can start from what that group left.
_MODULUS = 251
_BLOCK_STEP = 97
_REGION_STEP = 53
_LAYER_STEP = 37

_WIDE = (torch.int64, torch.int32, torch.int16)
#: Offsets into the ramp are multiples of 8 so pattern views can be read as
#: int64 words, and reduced modulo one period (8 x 251 bytes) per chunk.
_PERIOD = 8 * _MODULUS
#: Pattern shift from one selected block to the next (776 B = 23 mod 251).
_BLOCK_BYTES = 8 * _BLOCK_STEP
#: Pattern shift from one layer of a group to the next (296 B = 45 mod 251).
_LAYER_BYTES = 8 * _LAYER_STEP
#: Blocks in one chunk at most: blocks fewer than 251 apart never share a
#: pattern, so a byte the rotating load leaves behind (or moves to the wrong
#: block of the chunk) is always seen.
_MOST_BLOCKS = _MODULUS - 1
#: Rows :func:`split_rows` aims for: long enough to stream, short enough that
#: the pattern of a multi-MiB page reads a ramp of a few hundred KiB at most.
_ROW_BYTES = (1 << 10, 16 << 10)


@dataclass(frozen=True)
class LayerDamage:
    """What the data check found for one layer.

    ``first_mismatch`` is ``(block id, region, byte in the region's block)``
    of the earliest wrong byte; ``store_error`` is torch's message when the
    edited view could not be stored or loaded at all (e.g. an expanded view
    whose token rows alias one another).
    """

    mismatched_bytes: int = 0
    first_mismatch: tuple[int, str, int] | None = None
    store_error: str | None = None
    #: Position of the layer whose run stands for this one (its group repeats
    #: that layer's group view for view, see :func:`_distinct`); ``None``
    #: when the layer's own bytes were moved and compared.
    checked_with: int | None = None


def default_chunk_bytes(device: torch.device) -> int:
    """Tile budget: 4 MiB on the CPU, 256 MiB on CUDA.

    On the CPU a tile and its store buffer (8 MiB together) stay within a
    share of the last-level cache (32 MiB L3 on the 2-core EPYC the
    benchmarks ran on), so every pass after a tile's first hits cache; 2 to
    8 MiB are measured in ``benchmarks/bench_edits.py`` (1 MiB tiles spend
    more time in Python than in torch: 0.22x of a copy).  On CUDA the tile
    is large enough that kernel launches do not dominate.
    """
    return (256 << 20) if device.type == "cuda" else (4 << 20)


@contextlib.contextmanager
def _threads(device: torch.device, threads: int | None):
    """Run torch calls on ``threads`` intra-op threads, then restore the caller's.

    Used for a run whose tiles go in order (each call split over
    ``threads``) and for the calling thread of a run whose threads share
    the tiles (one each, see :func:`_workers`).  ``None`` keeps the
    caller's setting.
    """
    before = torch.get_num_threads()
    if device.type != "cpu" or threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compare_kernel(device: torch.device) -> str:
    """``"ne"`` (``ne`` + ``any``, one output byte per word) off the CPU,
    ``"xor"`` (``xor`` + ``max`` over ``uint8``) on it, where it streams
    faster.  Both are exact.

    ``torch.equal`` (reads both sides, writes nothing, stops at the first
    difference) was measured on the CPU too: no faster with one thread per
    tile (``benchmarks/bench_edits.py``'s model row, 21 runs alternating in
    one process: median 0.247 s against 0.257 s with ``restore=True``) and
    slower in a run of one thread (0.368 s against 0.324 s); it does not
    split over intra-op threads.
    """
    return "xor" if device.type == "cpu" else "ne"


# --------------------------------------------------------------------------
# The pattern
# --------------------------------------------------------------------------


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
    like: tuple[Sequence[int], Sequence[int]],
    tag: int,
    ordinal0: int,
    count: int,
    layers: int = 1,
) -> torch.Tensor:
    """Pattern ``[layers, count, *shape]``: a view of ``ramp``.

    ``like`` is ``(shape, stride)`` of one block of a view of a layer's
    bytes as ``uint8`` or a wider integer dtype, the dtype of ``ramp``
    (:func:`_block`).  The byte ``p`` bytes
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
    shape, stride = like
    inner = [(d * word) % _PERIOD // word for d in stride]
    offset = (tag + _BLOCK_BYTES * ordinal0) % _PERIOD
    return ramp.as_strided(
        (layers, count, *shape),
        (_LAYER_BYTES // word, _BLOCK_BYTES // word, *inner),
        offset // word,
    )


def _block(view: torch.Tensor, dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, stride)`` of one block of ``view``, whose block dim is ``dim``."""
    return tuple(view.shape[dim + 1 :]), view.stride()[dim + 1 :]


def pattern_bytes(like: torch.Tensor) -> int:
    """Ramp bytes one block of the pattern over ``like`` reads past its offset."""
    word = like.element_size()
    return word + sum(
        (n - 1) * ((d * word) % _PERIOD)
        for n, d in zip(like.shape[1:], like.stride()[1:], strict=True)
    )


def split_rows(view: torch.Tensor) -> torch.Tensor:
    """``view`` with a long contiguous last dim split into rows (a view).

    The pattern reads the ramp with the view's strides modulo 8 x 251 bytes,
    so a contiguous last dim of ``D`` words reads ``D`` words of ramp, the
    whole 16.9 MB of a Nemotron-H state, while ``[D / R, R]`` reads about
    ``R + (D / R) x (R mod 2008)`` bytes.  Among the divisors ``R`` of ``D``
    with rows of 1-16 KiB, the one that reads least is taken; the bytes,
    their order and the storage are unchanged.
    """
    if view.ndim < 2 or view.stride(-1) != 1:
        return view
    word, size = view.element_size(), view.shape[-1]
    if size * word <= _ROW_BYTES[1]:
        return view
    rows = _row_count(size, word, pattern_bytes(view))
    return view if rows is None else view.unflatten(-1, (rows, size // rows))


@functools.lru_cache(maxsize=256)
def _row_count(size: int, word: int, reach: int) -> int | None:
    """The row count :func:`split_rows` picks for a last dim of ``size`` words."""
    best = None
    fewest = max(2, cdiv(size * word, _ROW_BYTES[1]))
    for rows in range(fewest, size * word // _ROW_BYTES[0] + 1):
        if size % rows:
            continue
        row = size // rows
        cost = row * word + (rows - 1) * ((row * word) % _PERIOD)
        if cost < reach:
            best, reach = rows, cost
    return best


def _ramp(length: int, device: torch.device) -> torch.Tensor:
    length = cdiv(length, 8) * 8
    return (torch.arange(length, device=device) % _MODULUS + 1).to(torch.uint8)


def _layer_tag(index: int) -> int:
    """Pattern offset of the ``index``-th layer of any group (bytes).

    Linear in ``index`` (reduced modulo the period only when a view of the
    ramp is taken), so consecutive layers of a group read their patterns as
    one strided view of the ramp (see :class:`_Stack`).
    """
    return _LAYER_BYTES * index


# --------------------------------------------------------------------------
# Layers as the engine sees them
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fill:
    """A view to fill and compare through: its bytes, widened, and its tag."""

    label: str
    view: torch.Tensor  # uint8 [num_blocks, ...]
    wide: torch.Tensor  # the same bytes as the widest integer dtype they allow
    tag: int


@dataclass(frozen=True)
class TiledLayer:
    """A :class:`~kvexplore.editing.proof.LayerUnderTest` with its pattern tags.

    ``regions`` are the registered regions (the compare locates damage in
    them); ``fills`` what the fill and the compare go through: the regions,
    or one span when they tile one contiguous byte range.
    """

    position: int  # index in the list handed to :func:`exercise`
    layer: LayerUnderTest
    regions: tuple[_Fill, ...]
    fills: tuple[_Fill, ...]

    @classmethod
    def of(
        cls, position: int, layer: LayerUnderTest, spans: dict | None = None
    ) -> TiledLayer:
        """``spans``: :func:`_fill_views`'s answers so far, shared by a run's layers."""
        regions = _tagged(layer)
        return cls(position, layer, regions, _fill_views(regions, spans))

    @property
    def edited_parts(self) -> tuple[torch.Tensor, ...]:
        return self.layer.edited_parts


def _tagged(layer: LayerUnderTest) -> tuple[_Fill, ...]:
    """The layer's regions with their pattern tags.

    A region's tag is the layer's tag plus the region's offset from the
    layer's first registered byte of block 0, so the pattern is a function of
    the byte's position in the page: K and V (or conv and SSM) differ because
    they sit at different offsets.  Regions on separate storages get
    distinct offsets instead.
    """
    base = _layer_tag(layer.index)
    views = [r.view for r in layer.regions]
    if len({v.untyped_storage().data_ptr() for v in views}) == 1:
        first = min(v.storage_offset() for v in views)
        offsets = [v.storage_offset() - first for v in views]
    else:
        offsets = [8 * ((_REGION_STEP * k) % _MODULUS) for k in range(len(views))]
    return tuple(
        _Fill(r.label, split_rows(r.view), split_rows(_widest(r.view)), base + offset)
        for r, offset in zip(layer.regions, offsets, strict=True)
    )


def _fill_views(regions: tuple[_Fill, ...], spans: dict | None = None) -> tuple[_Fill, ...]:
    """Views to fill and compare a layer through: its regions, or one span.

    When the regions of a block tile one contiguous byte range with neither
    gap nor overlap, on one storage and with one block stride (conv then SSM
    state of a Mamba page; K and V interleaved token by token in vLLM 0.33's
    attention page), that range is one view ``[num_blocks, span]``: it holds
    exactly the regions' bytes, and because the pattern depends on position
    only, filling it writes the very bytes the per-region fills would, in
    one streaming call instead of one per region (or per 128-byte K/V run).

    Whether the regions tile a span depends only on their shapes, strides
    and offsets from one another, so ``spans`` keeps the answer per such
    geometry (``(start past the first region, length)`` or ``None``) and
    the layers of a group work it out once.
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
    base = min(v.storage_offset() for v in views)
    shape = tuple((tuple(v.shape), v.stride(), v.storage_offset() - base) for v in views)
    spans = {} if spans is None else spans
    if shape not in spans:
        runs = [block_runs(v, torch.zeros(1, dtype=torch.int64)) for v in views]
        lo = min(int(starts.min()) for starts, _ in runs)
        hi = max(int(starts.max()) + length for starts, length in runs)
        total = sum(starts.numel() * length for starts, length in runs)
        whole = total == hi - lo and int(union_bytes(runs)[0]) == total
        spans[shape] = (lo - base, total) if whole else None
    if spans[shape] is None:
        return regions
    start, total = spans[shape]
    span = storage_bytes(views[0]).as_strided(
        (views[0].shape[0], total), (views[0].stride(0), 1), base + start
    )
    first = min(regions, key=lambda r: r.view.storage_offset())
    label = "+".join(r.label for r in regions)
    return (_Fill(label, split_rows(span), split_rows(_widest(span)), first.tag),)


def _aligned(nbytes: int) -> int:
    return cdiv(nbytes, 16) * 16


def _block_bytes(layer: TiledLayer) -> int:
    """Bytes one block of ``layer`` needs in the store buffer (or compare)."""
    stored = sum(_aligned(e[0].numel() * e.element_size()) for e in layer.edited_parts)
    return max(stored, sum(f.view[0].numel() for f in layer.fills))


# --------------------------------------------------------------------------
# Stacks and groups
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stack:
    """Consecutive layers of one group whose views differ only by an offset.

    vLLM 0.33's unified registration places the layers of one
    ``KVCacheTensor`` ``layer_stride`` bytes apart
    (``vllm/v1/kv_cache_interface.py``, ``create_kv_cache_views``), so their
    registered regions, and the edited views made from them, are one view
    shifted by a constant.  A stack views them all at once with a leading
    layer dim, ``[L, num_blocks, ...]``: fill, store, load and compare
    then cost one torch call per region for the whole stack instead of one
    per layer.  Layers are stacked only when each shift is at least one
    layer's whole extent, so a stacked call touches exactly the bytes the
    per-layer calls would; anything else (the legacy registration's separate
    tensors, views that overlap) is a stack of one.
    """

    layers: tuple[TiledLayer, ...]
    fills: tuple[torch.Tensor, ...]  # per fill view: [L, num_blocks, ...] (wide)
    parts: tuple[torch.Tensor, ...]  # per edited tensor: [L, num_blocks, ...]
    #: Every registered and edited view steps by the same bytes from one layer
    #: to the next, so rotating the layers of the edited views moves each
    #: layer's registered bytes onto the next layer's (a one-block tile).
    rotatable: bool = False

    @classmethod
    def of(cls, layers: Sequence[TiledLayer], shifts: list[int] | None) -> _Stack:
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
        steps = {d * v.element_size() for v, d in zip(views, shifts or [], strict=False)}
        count = len(first.fills)
        return cls(
            tuple(layers),
            tuple(stacked[:count]),
            tuple(stacked[count:]),
            rotatable=len(layers) > 1 and len(steps) == 1,
        )

    def axis(self, blocks: int) -> int | None:
        """The dim a tile of ``blocks`` blocks rotates on the load.

        1 (blocks) when the tile has two or more; else 0 (layers) when the
        stack has two or more that step alike; else ``None``: the load goes
        back to the same place after the registered bytes are zeroed.
        """
        if blocks > 1:
            return 1
        return 0 if self.rotatable else None

    def unit_bytes(self, axis: int, blocks: int) -> int:
        """Bytes of the edited views in one block of every layer (``axis`` 1),
        or one layer of ``blocks`` blocks (``axis`` 0)."""
        total = sum(p[0, 0].numel() * p.element_size() for p in self.parts)
        return total * (len(self.layers) if axis == 1 else blocks)

    def extents(self) -> tuple[_Extent, ...]:
        """Where each fill view's bytes lie and which pattern they carry."""
        return tuple(
            _Extent.of(f, layer_fill.tag)
            for f, layer_fill in zip(self.fills, self.layers[0].fills, strict=True)
        )

    def patterns(self) -> tuple:
        """Each fill view's geometry with its pattern tag."""
        return tuple(
            (*_geometry(f), layer_fill.tag)
            for f, layer_fill in zip(self.fills, self.layers[0].fills, strict=True)
        )

    def singles(self) -> list[_Stack]:
        """One stack per layer (after a stacked call raised)."""
        return [_Stack.of([layer], None) for layer in self.layers]


@dataclass(frozen=True)
class _Extent:
    """Which bytes a stacked fill view ``[L, blocks, ...]`` reaches, and its pattern.

    ``start`` is the byte offset of layer 0, block 0; layer ``l``, block
    ``j`` reaches ``length`` bytes from ``start + l * layer_step + j *
    block_step`` (all of them when ``dense``).  The pattern a fill writes at
    byte ``A`` of layer ``l``, block ``j`` is ``1 + (phase + A + f(l, j))
    mod 251`` (see :func:`_pattern`), with ``f`` fixed by the two steps:
    two fills with equal steps and phase write the same value on every
    byte they share.
    """

    storage: int
    layers: int
    layer_step: int
    block_step: int
    start: int
    length: int
    phase: int
    dense: bool

    @classmethod
    def of(cls, stacked: torch.Tensor, tag: int) -> _Extent:
        word = stacked.element_size()
        one = stacked[0]
        length = element_extent(tuple(one.shape[1:]), one.stride()[1:]) * word
        starts, run = block_runs(one, torch.zeros(1, dtype=torch.int64))
        start = stacked.storage_offset() * word
        return cls(
            storage=stacked.untyped_storage().data_ptr(),
            layers=stacked.shape[0],
            layer_step=stacked.stride(0) * word if stacked.shape[0] > 1 else 0,
            block_step=one.stride(0) * word,
            start=start,
            length=length,
            phase=(tag - start) % _MODULUS,
            dense=length > 0 and int(union_bytes([(starts, run)])[0]) == length,
        )

    def holds(self, other: _Extent) -> bool:
        """Every byte ``other`` reaches is one of ours, in the same layer and
        block, where we wrote the value ``other``'s fill would write."""
        return (
            self.dense
            and self.storage == other.storage
            and self.layers == other.layers
            and self.layer_step == other.layer_step
            and self.block_step == other.block_step
            and self.phase == other.phase
            and self.start <= other.start
            and other.start + other.length <= self.start + self.length
        )


def _geometry(t: torch.Tensor) -> tuple:
    """Which bytes a view reaches, and as what: storage, offset, shape, strides, dtype."""
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
    )


def _shifts(a: TiledLayer, b: TiledLayer) -> list[int] | None:
    """Per view, how far ``b``'s view lies past ``a``'s, when it is ``a``'s shifted.

    ``None`` unless every registered region and edited tensor of ``b`` is the
    same dtype, shape and strides on the same storage as ``a``'s, starting at
    least one whole extent after it (so the two never share a byte), and the
    pattern tags step by one layer.
    """
    if len(a.fills) != len(b.fills) or len(a.edited_parts) != len(b.edited_parts):
        return None
    if any(
        fb.tag - fa.tag != _LAYER_BYTES for fa, fb in zip(a.fills, b.fills, strict=True)
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
        if shift < element_extent(tuple(x.shape), tuple(x.stride())):
            return None
        out.append(shift)
    return out


def _stacks(members: Sequence[TiledLayer]) -> list[_Stack]:
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


class _Tally:
    """The engine's running count per layer; frozen into :class:`LayerDamage`.

    The only mutable state a run's workers share: mismatches add up over
    tiles, and a layer whose edited view torch refuses to write is left out
    of later stores (its coverage already failed).  Every update takes the
    lock, and what is kept does not depend on the order tiles finish in:
    counts add up, and the first mismatch and the store error are those of
    the earliest block.
    """

    def __init__(self, count: int) -> None:
        self.lock = threading.Lock()
        self.mismatched = [0] * count
        self.first: list[tuple[tuple[int, int, int], tuple[int, str, int]] | None]
        self.first = [None] * count
        self.errors: list[str | None] = [None] * count
        self._error_at: list[int | None] = [None] * count
        self.sources: list[int | None] = [None] * count

    def refuse(self, position: int, ordinal: int, message: str) -> None:
        """Torch refused layer ``position``'s edited view in a chunk from ``ordinal`` on."""
        with self.lock:
            at = self._error_at[position]
            if at is None or ordinal < at:
                self.errors[position], self._error_at[position] = message, ordinal

    def add(
        self, position: int, wrong: int, key: tuple[int, int, int], first: tuple[int, str, int]
    ) -> None:
        """``wrong`` more bytes of layer ``position``; ``key`` orders ``first`` among its bytes."""
        with self.lock:
            self.mismatched[position] += wrong
            known = self.first[position]
            if known is None or key < known[0]:
                self.first[position] = (key, first)

    def repeat(self, source: int, twin: int) -> None:
        """Layer ``twin`` found what layer ``source`` found (see :func:`_distinct`)."""
        self.mismatched[twin] = self.mismatched[source]
        self.first[twin] = self.first[source]
        self.errors[twin] = self.errors[source]
        self.sources[twin] = source

    def damage(self) -> tuple[LayerDamage, ...]:
        return tuple(
            LayerDamage(
                mismatched_bytes=m,
                first_mismatch=None if f is None else f[1],
                store_error=e,
                checked_with=c,
            )
            for m, f, e, c in zip(
                self.mismatched, self.first, self.errors, self.sources, strict=True
            )
        )


class Group:
    """One KV cache group's layers in a tile, as stacks, with their scratch views.

    The scratch buffer first takes the stores (every edited tensor of every
    stack, one after the other) and, once they are loaded back, the compare
    outputs (every fill view of every stack, one after the other), so one
    reduction over their union answers "did every byte come back?" for the
    group's share of the tile.  The views depend only on the number of
    blocks in the tile and are built once per number.
    """

    def __init__(self, members: Sequence[TiledLayer], kernel: str, keep: bool = False) -> None:
        """``keep``: keep each step's views for the next (:meth:`_cached`)."""
        self.stacks = _stacks(members)
        self.ne = kernel == "ne"  # compare with ne + any (else xor + max)
        self.keep = keep
        self._views: dict[int, tuple] = {}
        self._extents: tuple[tuple[_Extent, ...], ...] | None = None
        self._inherits: dict[tuple, tuple[int, ...] | None] = {}
        self._pieces: dict[tuple, torch.Tensor] = {}
        self._memo: dict[tuple, object] = {}
        #: The layers in the order :meth:`identity` lists them.
        self.layers = tuple(layer for s in self.stacks for layer in s.layers)

    @classmethod
    def of(cls, layers: Sequence[LayerUnderTest], kernel: str = "xor") -> Group:
        """All of ``layers`` as one group (tests look at its stacks)."""
        return cls([TiledLayer.of(i, layer) for i, layer in enumerate(layers)], kernel)

    def scratch_bytes(self, n: int) -> int:
        """Scratch a chunk of ``n`` blocks needs, also once every stack is split."""
        singles = [single for s in self.stacks for single in s.singles()]
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
        ``outs[i][k]``: the compare output of fill view ``k`` of stack ``i``;
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
                start = cdiv(cursor, word) * word
                if start > cursor:
                    gaps.append(scratch[cursor:start])
                nbytes = math.prod(shape) * word
                row.append(scratch[start : start + nbytes].view(dtype).view(shape))
                cursor = start + nbytes
            outs.append(row)
        flat = scratch[:cursor].view(torch.bool) if self.ne else scratch[:cursor]
        self._views[n] = stores, outs, flat, gaps
        return self._views[n]

    def piece(self, n: int, where: tuple, dim: int, at: int, length: int) -> torch.Tensor:
        """``narrow`` of a scratch view (``where`` names it in :meth:`views`).

        Scratch views are the same for every chunk of ``n`` blocks, and so
        are their pieces: they are cut once (a ``narrow`` costs as much as a
        small tile's copy takes per layer).
        """
        key = (n, where, dim, at, length)
        if key not in self._pieces:
            kind, s, k = where
            whole = self._views[n][0 if kind == "store" else 1][s][k]
            self._pieces[key] = whole.narrow(dim, at, length)
        return self._pieces[key]

    def extents(self) -> tuple[tuple[_Extent, ...], ...]:
        """Per stack, its fill views' :class:`_Extent`."""
        if self._extents is None:
            self._extents = tuple(stack.extents() for stack in self.stacks)
        return self._extents

    def fill_bytes(self) -> int:
        """Bytes one block of the group's fills writes (the first fill of a tile is the largest)."""
        return sum(f.view[0].numel() for layer in self.layers for f in layer.fills)

    def inherits(self, carry: Carry, n: int) -> list[int] | None:
        """Per stack, the turns of the pattern ``carry`` left on its fills; ``None`` to fill.

        A stack inherits when one stack of the group before it held every
        one of its fill views' bytes (:meth:`_Extent.holds`) and rotates on
        the same axis: its bytes then hold exactly the pattern its own fill
        would write, moved as that stack's loads moved it (the group before
        compared every one of them).  vLLM's Qwen3.5 attention page holds
        the Gated-DeltaNet state of the same layer and block, so the
        Gated-DeltaNet group starts where the attention group ended.
        """
        key = (carry.layout, n)
        if key not in self._inherits:
            self._inherits[key] = self._sources(carry, n)
        sources = self._inherits[key]
        return None if sources is None else [carry.turns[i] for i in sources]

    def _sources(self, carry: Carry, n: int) -> tuple[int, ...] | None:
        sources = []
        for stack, extents in zip(self.stacks, self.extents(), strict=True):
            found = next(
                (
                    i
                    for i, (held, axis) in enumerate(carry.layout)
                    if axis == stack.axis(n)
                    and all(any(h.holds(e) for h in held) for e in extents)
                ),
                None,
            )
            if found is None:
                return None
            sources.append(found)
        return tuple(sources)

    def identity(self) -> tuple:
        """Everything the group's round trip does to memory, view for view.

        Per stack: its fills with their pattern tags, its edited views and
        whether its layers rotate; per layer, its registered regions with
        their labels.  Two groups with equal identities make the very same
        torch calls on the very same bytes from the very same pattern, so
        they find the very same damage, byte for byte: vLLM overlays groups
        of one spec through the same views of the same ``KVCacheTensor``
        bytes (Qwen3.5's three Gated-DeltaNet groups), and :func:`exercise`
        runs such a group once for all of them.
        """
        return tuple(
            (
                stack.rotatable,
                stack.patterns(),
                tuple(_geometry(e) for e in stack.parts),
                tuple(
                    (r.label, r.tag, *_geometry(r.view))
                    for layer in stack.layers
                    for r in layer.regions
                ),
            )
            for stack in self.stacks
        )

    def run(
        self,
        lo: int,
        chunk: slice,
        ramps: dict,
        scratch: torch.Tensor,
        tally: _Tally,
        carry: Carry | None = None,
        first: int | None = None,
    ) -> Carry | None:
        """Fill, store / load and compare ``chunk`` for this group.

        ``chunk`` indexes the group's views; ``first`` is the block id its
        first block stands for in reports (``chunk.start`` when ``None``; a
        replica's chunk starts at 0, see :class:`_Replica`).

        ``carry`` is what the group before it in the tile left: when its
        fills held this group's (:meth:`inherits`), the fill is skipped and
        the compare expects that group's pattern rotated once more.  Returns
        this group's carry, or ``None`` when something failed (the next group
        then fills).

        A stack of several layers whose stacked store raises is split into
        one stack per layer and the tile is tried again (filled afresh), so
        the error lands on the layer that caused it; a single layer that
        raises is recorded in ``tally`` and left out.  Each attempt either
        succeeds or splits one stack, so there are at most as many attempts
        as layers, plus one.
        """
        attempts = 1 + sum(len(s.layers) for s in self.stacks)
        first = chunk.start if first is None else first
        for _ in range(attempts):
            raised, out = self._attempt(lo, chunk, ramps, scratch, tally, carry, first)
            if raised is None:
                return out
            self._split(raised)
            carry = None
        raise AssertionError("a tile was retried more often than it has layers")

    def _split(self, stack: _Stack) -> None:
        at = self.stacks.index(stack)
        self.stacks[at : at + 1] = stack.singles()
        self._views.clear()
        self._extents = None
        self._inherits.clear()
        self._pieces.clear()
        self._memo.clear()

    def _attempt(
        self,
        lo: int,
        chunk: slice,
        ramps: dict,
        scratch: torch.Tensor,
        tally: _Tally,
        carry: Carry | None,
        first: int,
    ) -> tuple[_Stack | None, Carry | None]:
        """One fill / store / load / compare: the stack that raised, and the carry."""
        start, n = chunk.start, chunk.stop - chunk.start
        self.views(n, scratch)
        tiles = self._cached(
            ("fills", start, n),
            lambda: [[f.narrow(1, start, n) for f in stack.fills] for stack in self.stacks],
        )
        # 1. fill through the registered views, unless they hold a known pattern
        inherited = None if carry is None else self.inherits(carry, n)
        if inherited is not None:
            turns = inherited
        else:
            turns = [0] * len(self.stacks)
            for stack, actuals in zip(self.stacks, tiles, strict=True):
                _put(stack, actuals, ramps, lo, None, 0)
        # 2. store and load each block (or layer) some places further on
        clean = True
        for s, stack in enumerate(self.stacks):
            if any(tally.errors[layer.position] for layer in stack.layers):
                clean = False
                continue
            axis = stack.axis(n)
            m, h, moves = self._cached(
                ("moves", s, start, n), lambda s=s: self._moves(s, start, n, tiles[s])
            )
            error = _store_load(moves)
            if error is None:
                if axis is not None:
                    turns[s] = (turns[s] + h) % m
                continue
            if len(stack.layers) > 1:
                return stack, None
            tally.refuse(stack.layers[0].position, lo, error)
            clean = False
            _put(stack, tiles[s], ramps, lo, axis, turns[s])  # the pattern it had
        # 3. every byte where it belongs?
        if self._matches(start, n, tiles, ramps, lo, turns, scratch):
            if not clean:
                return None, None
            layout = tuple(
                (extents, stack.axis(n))
                for stack, extents in zip(self.stacks, self.extents(), strict=True)
            )
            return None, Carry(layout, tuple(turns))
        for s, stack in enumerate(self.stacks):
            rotation = Rotation(stack.axis(n), turns[s], len(stack.layers))
            for place, layer in enumerate(stack.layers):
                for k in range(len(layer.regions)):
                    locate(layer, k, lo, chunk, ramps, tally, rotation, place, first)
        return None, None

    def _cached(self, key: tuple, make):
        """``make()``, once per ``key`` until the stacks change.

        A step's views (narrowed fills, the copies of a load, the compare's
        pieces) depend only on where the chunk starts and how long it is, and
        every chunk of a replica starts at block 0 (:class:`_Replica`): they
        are cut once and reused (``keep``), since cutting a view costs
        microseconds of Python per call, as much as a small page's copy.  In
        the cache every chunk starts elsewhere, and nothing is kept.
        """
        if not self.keep:
            return make()
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = make()
        return found

    def _moves(self, s: int, start: int, n: int, fills: list[torch.Tensor]) -> tuple:
        """``(m, h, copies)`` of one store and load of stack ``s`` (see :func:`_store_load`)."""
        stack = self.stacks[s]
        axis = stack.axis(n)
        buffers, m, h = self._views[n][0][s], 1, 0
        if axis is not None:
            m = n if axis == 1 else len(stack.layers)
            h = shift(m, stack.unit_bytes(axis, n))
            buffers = [self.piece(n, ("store", s, j), axis, 0, h) for j in range(len(buffers))]
        return m, h, _store_load_copies(stack, start, n, buffers, fills, axis, h)

    def _matches(
        self,
        start: int,
        n: int,
        tiles: list[list[torch.Tensor]],
        ramps: dict,
        lo: int,
        turns: list[int],
        scratch: torch.Tensor,
    ) -> bool:
        """Does every fill view of the chunk hold its pattern, rotated ``turns``?

        Every view's difference goes into the scratch buffer (free once the
        loads are done), and one reduction over all of them answers.
        """
        pieces = self._cached(
            ("compare", start, n, tuple(turns)), lambda: self._pieces_of(n, tiles, turns)
        )
        _, _, flat, gaps = self.views(n, scratch)
        differ = torch.ne if self.ne else torch.bitwise_xor
        for actual, tag, axis, turn, cuts in pieces:
            expected = _expected(ramps, actual, tag, lo, axis, turn)
            for (piece, out), (_, _, _, pattern) in zip(cuts, expected, strict=True):
                differ(piece, pattern, out=out)
        for gap in gaps:
            gap.zero_()
        return not flat.numel() or not (bool(flat.any()) if self.ne else bool(flat.max()))

    def _pieces_of(self, n: int, tiles: list[list[torch.Tensor]], turns: list[int]) -> list:
        """Per fill view of the chunk: what its compare reads and where it writes.

        ``(actual, tag, axis, turns, [(piece of actual, output), ...])``, the
        pieces in :func:`_expected`'s order.
        """
        outs = self._views[n][1]
        found = []
        for s, stack in enumerate(self.stacks):
            axis = stack.axis(n)
            for k, actual in enumerate(tiles[s]):
                if not actual.numel():
                    continue
                cuts = [
                    (actual, outs[s][k])
                    if dim is None
                    else (
                        actual.narrow(dim, at, length),
                        self.piece(n, ("out", s, k), dim, at, length),
                    )
                    for dim, at, length in _cuts(actual, axis, turns[s])
                ]
                found.append((actual, stack.layers[0].fills[k].tag, axis, turns[s], cuts))
        return found


@dataclass(frozen=True)
class Carry:
    """What a group leaves in a tile once its compare passed.

    ``layout``: per stack, its fill views' extents and the axis its loads
    rotate on; ``turns``: per stack, how many places the loads have rotated
    the pattern since the fill.
    """

    layout: tuple[tuple[tuple[_Extent, ...], int | None], ...]
    turns: tuple[int, ...]


@dataclass(frozen=True)
class Rotation:
    """Where a stack's bytes are after ``turns`` rotating loads on ``axis``."""

    axis: int | None
    turns: int
    layers: int


def _expected(
    ramps: dict,
    actual: torch.Tensor,
    tag: int,
    lo: int,
    axis: int | None,
    turns: int,
) -> list[tuple[int | None, int, int, torch.Tensor]]:
    """The pattern a stacked fill view's chunk ``[L, n, ...]`` holds.

    ``(dim, start, length, pattern)``: ``actual.narrow(dim, start, length)``
    must equal ``pattern`` (all of ``actual`` when ``dim`` is ``None``).
    After ``turns`` loads rotating the blocks of the chunk (``axis`` 1),
    block ``b`` holds the pattern of block ``b - turns`` (cyclically);
    rotating the layers (``axis`` 0), layer ``l`` holds that of layer
    ``l - turns``.  Each side of the wrap is one strided ramp view.
    """
    like = _block(actual, 1)
    layers, n = actual.shape[0], actual.shape[1]
    key = (actual.dtype, like, layers, n, tag, lo, axis, turns)
    memo = getattr(ramps, "memo", None)
    found = None if memo is None else memo.get(key)
    if found is not None:
        return found
    ramp = ramps[actual.dtype]
    found = []
    for dim, at, length in _cuts(actual, axis, turns):
        if dim is None:
            pattern = _pattern(ramp, like, tag, lo, n, layers)
        elif dim == 1:  # blocks ``at ..`` hold those from ``lo`` on, the first ``turns`` wrap
            pattern = _pattern(ramp, like, tag, lo + (n - turns if at == 0 else 0), length, layers)
        else:  # layers ``at ..`` hold those from 0 on, the first ``turns`` wrap
            wrapped = tag + (_LAYER_BYTES * (layers - turns) if at == 0 else 0)
            pattern = _pattern(ramp, like, wrapped, lo, n, length)
        found.append((dim, at, length, pattern))
    if memo is not None:
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = found
    return found


def _cuts(actual: torch.Tensor, axis: int | None, turns: int) -> list[tuple[int | None, int, int]]:
    """``(dim, start, length)`` of each side of the wrap (:func:`_expected`)."""
    if axis is None or turns == 0:
        return [(None, 0, 0)]
    size = actual.shape[0 if axis == 0 else 1]
    return [(axis, turns, size - turns), (axis, 0, turns)]


#: Pattern views :class:`_Patterns` keeps at most (then it starts again).
_MEMO_SIZE = 4096


class _Patterns(dict):
    """The ramp as every integer dtype (``patterns[dtype]``), and a memo of
    the pattern views :func:`_expected` cut from it.

    Chunks at the same ordinal of every window read the same pattern
    views, and the steps of one chunk's windows run one after the other:
    the views are kept instead of cut again (each cut is a few microseconds
    of Python), up to :data:`_MEMO_SIZE` of them.
    """

    def __init__(self, ramp: torch.Tensor) -> None:
        super().__init__({dtype: ramp.view(dtype) for dtype in (*_WIDE, torch.uint8)})
        self.memo: dict[tuple, list] = {}


def _put(
    stack: _Stack,
    actuals: list[torch.Tensor],
    ramps: dict,
    lo: int,
    axis: int | None,
    turns: int,
) -> None:
    """Write the pattern (rotated ``turns`` times on ``axis``) through the fills."""
    for k, actual in enumerate(actuals):
        tag = stack.layers[0].fills[k].tag
        for dim, at, length, expected in _expected(ramps, actual, tag, lo, axis, turns):
            target = actual if dim is None else actual.narrow(dim, at, length)
            target.copy_(expected)


def half(m: int) -> int:
    """``ceil(m / 2)``: the furthest a rotating load moves each of ``m >= 2``
    blocks (or layers), see :func:`shift`."""
    return (m + 1) // 2


#: Bytes a rotating load moves per torch call at least, where the chunk
#: allows: fewer and a tile of small pages spends its time in Python.
_SEGMENT_BYTES = 1 << 20


def shift(m: int, unit_bytes: int) -> int:
    """How far a rotating load moves each of ``m >= 2`` blocks (or layers).

    ``h`` places, ``0 < h < m``, so a byte the load leaves behind keeps a
    pattern that is not the one expected there.  The load stores ``h``
    units and copies the other ``m - h`` in segments of ``h``, so it reads
    and writes ``(m + h) / m`` of the chunk: ``h`` is the fewest units of
    ``unit_bytes`` that make a segment of :data:`_SEGMENT_BYTES`, at least
    1 and at most :func:`half` (one segment).  Qwen3.5-0.8B on the H100,
    three 1,179,648-byte blocks of one layer: ``h = 1``, 4/3 of the chunk
    against 5/3 with ``h = half(3) = 2``.
    """
    return max(1, min(half(m), cdiv(_SEGMENT_BYTES, max(1, unit_bytes))))


def _store_load_copies(
    stack: _Stack,
    start: int,
    n: int,
    buffers: list[torch.Tensor],
    fills: list[torch.Tensor],
    axis: int | None,
    h: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The copies of one store and one load of blocks ``start .. start + n``
    through the edited views of a stack, in order: ``(target, source)``,
    ``source`` ``None`` to zero the target.

    Every block (layer, on ``axis`` 0) of the chunk's ``m`` moves ``h``
    places on (:func:`shift`), cyclically, as a connector loads a saved
    block into whichever block is free: the last ``h`` are stored to
    ``buffers`` (``h`` long on ``axis``; views of a separate buffer
    allocated once per run; a fresh allocation per chunk would pay page
    faults on every store), the first ``m - h`` move ``h`` on in segments of
    ``h``, the last segment first (a segment and its target are disjoint,
    and each target was stored or moved on before), and the stored ones are
    loaded into the first ``h``: ``m + h`` units read and written where
    storing and loading all would take ``2 m``.  With no ``axis`` (one
    block of one layer) the whole chunk is stored, the registered bytes
    (``fills``) are zeroed and the load goes back to the same block.
    Either way a registered byte the edited view does not reach keeps a
    value the compare rejects.
    """
    parts = [e.narrow(1, start, n) for e in stack.parts]
    if axis is None:
        return (
            [(buf, part) for part, buf in zip(parts, buffers, strict=True)]  # the store
            + [(fill, None) for fill in fills]  # evicted
            + [(part, buf) for part, buf in zip(parts, buffers, strict=True)]
        )
    copies = [
        (buf, part.narrow(axis, part.shape[axis] - h, h))  # the store
        for part, buf in zip(parts, buffers, strict=True)
    ]
    for part, buf in zip(parts, buffers, strict=True):  # the load, rotated
        end = part.shape[axis] - h
        while end > 0:
            begin = max(0, end - h)
            copies.append(
                (part.narrow(axis, begin + h, end - begin), part.narrow(axis, begin, end - begin))
            )
            end = begin
        copies.append((part.narrow(axis, 0, h), buf))
    return copies


def _store_load(copies: list[tuple[torch.Tensor, torch.Tensor | None]]) -> str | None:
    """Make the copies of :func:`_store_load_copies`, in order.

    Returns torch's message when it refuses the views (e.g. an expanded view
    whose rows alias one another cannot be written), else ``None``.  Torch
    checks a view before writing through it, so a refused load writes
    nothing.
    """
    try:
        for target, source in copies:
            if source is None:
                target.zero_()
            else:
                target.copy_(source)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def locate(
    layer: TiledLayer,
    k: int,
    lo: int,
    chunk: slice,
    ramps: dict,
    tally: _Tally,
    rotation: Rotation | None = None,
    place: int = 0,
    first: int | None = None,
) -> None:
    """Count and locate the bytes of region ``k`` of ``layer`` that differ.

    ``layer`` is the ``place``-th of its stack, whose bytes ``rotation``
    has moved (none when ``None``); ``first`` is the block id reported for
    the chunk's first block (``chunk.start`` when ``None``).
    """
    n = chunk.stop - chunk.start
    r = layer.regions[k]
    actual = r.view[chunk]
    ramp = ramps[torch.uint8]
    axis, turns = (None, 0) if rotation is None else (rotation.axis, rotation.turns)
    if axis == 1 and turns:
        expected = torch.cat(
            [
                _pattern(ramp, _block(actual, 0), r.tag, lo + n - turns, turns)[0],
                _pattern(ramp, _block(actual, 0), r.tag, lo, n - turns)[0],
            ]
        )
    else:
        source = place
        if axis == 0:
            source = (place - turns) % rotation.layers
        tag = r.tag + _LAYER_BYTES * (source - place)
        expected = _pattern(ramp, _block(actual, 0), tag, lo, n)[0]
    diff = actual != expected
    wrong = int(diff.sum())
    if not wrong:
        return
    block, byte = torch.nonzero(diff.reshape(n, -1))[0].tolist()
    first = chunk.start if first is None else first
    tally.add(layer.position, wrong, (lo + block, k, byte), (first + block, r.label, byte))


# --------------------------------------------------------------------------
# Tiles
# --------------------------------------------------------------------------


def _chunks(blocks: Sequence[int], step: int) -> list[tuple[int, slice]]:
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


def _tiling(members: dict[int, list[TiledLayer]], chunk_bytes: int) -> tuple[int, int]:
    """``(blocks per chunk, layers per window)`` so a tile fits ``chunk_bytes``.

    A tile is a run of consecutive blocks times a window of layer positions
    (the ``i``-th to ``j``-th layer of every group: vLLM overlays the
    ``i``-th layers of all groups on one ``KVCacheTensor``).  Small pages
    take whole groups and many blocks; when one block of a group exceeds
    the budget (Qwen3.5-0.8B on the H100: 6 layers x 1,179,648 B), a tile
    is one layer and as many consecutive blocks as fit, at least one: in
    vLLM 0.33's layout a layer's blocks lie back to back, so the tile is one
    contiguous span (measured in ``benchmarks/bench_edits.py``'s model row
    against one block of three layers 72 MiB apart: median 0.46x against
    0.29x and 0.58x against 0.39x of a copy, alternating in one process).
    """
    widest = max(len(m) for m in members.values())
    heaviest = max(sum(_block_bytes(layer) for layer in m) for m in members.values())
    if heaviest <= chunk_bytes:
        return min(_MOST_BLOCKS, chunk_bytes // max(1, heaviest)), widest
    biggest = max(_block_bytes(layer) for m in members.values() for layer in m)
    return min(_MOST_BLOCKS, max(1, chunk_bytes // max(1, biggest))), 1


#: A replica may hold this many times the bytes its views reach (plus
#: :data:`_REPLICA_SLACK`): spans of unequal length take equal room.
_REPLICA_ROOM = 2
_REPLICA_SLACK = 64 << 10
#: Spans start on this boundary in the replica and keep every view's offset
#: modulo it, so rows align as they do in the cache.
_REPLICA_ALIGN = 64


@dataclass(frozen=True)
class _Slot:
    """One storage of a tile as its replica holds it.

    ``spans``: the disjoint ``[lo, hi)`` byte ranges of the live storage
    that the tile's views reach over a chunk's blocks (from the views' own
    offsets, as if the chunk started at block 0), ``lo`` on the
    :data:`_REPLICA_ALIGN` boundary; the ``k``-th lies ``k * width`` bytes
    into the replica's buffer.
    """

    storage: int
    spans: tuple[tuple[int, int], ...]
    width: int

    @property
    def nbytes(self) -> int:
        return self.width * len(self.spans)

    def offset(self, at: int) -> int:
        """Where byte ``at`` of the live storage lies in the replica."""
        k = bisect.bisect_right(self.spans, (at, math.inf)) - 1
        return k * self.width + at - self.spans[k][0]


@dataclass(frozen=True)
class _Replica:
    """Each tile's views rebuilt, offset for offset, on buffers of the tile's size.

    The round trip reads and writes nothing but the bytes the views reach,
    through their storage offsets, shapes, strides and dtypes, and it never
    needs what the cache held (every registered byte is filled first).  So
    with ``restore`` each tile runs on a replica: the bytes the tile's views
    reach on each storage, as spans (a window's layers, ``layer_stride``
    apart in vLLM 0.33's unified registration, are one span each, and the
    groups overlaid on a layer's bytes share it), laid side by side at one
    spacing on a buffer of the worker's own, each view moved with its span.
    A view lies inside one span, so views that share bytes in the cache
    share them in the replica and keep every offset from one another; views
    on two storages (an edited copy) stay on two buffers; the layers of a
    window stay equally spaced, so they still stack (:class:`_Stack`).  A
    chunk of ``n`` blocks starting anywhere is the replica's blocks
    ``0 .. n``: every view of a storage steps by the same bytes per block,
    so the chunk's bytes lie at the same offsets from its first block
    wherever it starts.  The live cache is never written, nothing is saved
    and put back, and a worker's replica stays in cache from one step to
    the next.

    :meth:`of` returns ``None`` (the tiles then run on the cache, saved
    and put back) where that does not hold: views of one storage stepping
    by different bytes per block, or spans so unequal that the replica
    would take more than :data:`_REPLICA_ROOM` times the bytes reached.
    """

    slots: tuple[tuple[_Slot, ...], ...]  # per tile
    sizes: tuple[int, ...]  # per slot index: the most bytes a tile needs there
    blocks: int  # the replica's block dim: the longest chunk
    device: torch.device

    @classmethod
    def of(
        cls, windows: Sequence[Sequence[TiledLayer]], blocks: int, device: torch.device
    ) -> _Replica | None:
        slots = []
        for window in windows:
            pieces: dict[int, list[tuple[int, int, int]]] = {}
            for layer in window:
                for view in _views(layer.layer):
                    word = view.element_size()
                    start = view.storage_offset() * word
                    step = view.stride(0) * word
                    reach = (blocks - 1) * step + word * element_extent(
                        tuple(view.shape[1:]), view.stride()[1:]
                    )
                    key = view.untyped_storage().data_ptr()
                    pieces.setdefault(key, []).append((step, start, start + reach))
            tile = []
            for key, found in pieces.items():
                if len({step for step, _, _ in found}) != 1:
                    return None
                spans = _merged(
                    [(lo // _REPLICA_ALIGN * _REPLICA_ALIGN, hi) for _, lo, hi in found]
                )
                width = max(cdiv(hi - lo, _REPLICA_ALIGN) * _REPLICA_ALIGN for lo, hi in spans)
                slot = _Slot(key, spans, width)
                if slot.nbytes > _REPLICA_ROOM * sum(hi - lo for lo, hi in spans) + _REPLICA_SLACK:
                    return None
                tile.append(slot)
            slots.append(tuple(tile))
        most = max((len(tile) for tile in slots), default=0)
        sizes = tuple(
            max(tile[k].nbytes for tile in slots if k < len(tile)) for k in range(most)
        )
        return cls(tuple(slots), sizes, blocks, device)

    def buffers(self) -> list[torch.Tensor]:
        """One worker's buffers, zeroed (a byte no view reaches stays 0)."""
        return [torch.zeros(n, dtype=torch.uint8, device=self.device) for n in self.sizes]

    def layers(
        self, t: int, window: Sequence[TiledLayer], buffers: list[torch.Tensor]
    ) -> list[LayerUnderTest]:
        """Tile ``t``'s layers with every view moved onto ``buffers``."""
        where = {slot.storage: (k, slot) for k, slot in enumerate(self.slots[t])}

        def moved(view: torch.Tensor) -> torch.Tensor:
            shape = (self.blocks, *view.shape[1:])
            if view.numel() == 0:
                return torch.empty(shape, dtype=view.dtype, device=self.device)
            k, slot = where[view.untyped_storage().data_ptr()]
            word = view.element_size()
            offset = slot.offset(view.storage_offset() * word) // word
            return buffers[k].view(view.dtype).as_strided(shape, view.stride(), offset)

        return [
            replace(
                layer.layer,
                regions=tuple(Region(r.label, moved(r.view)) for r in layer.layer.regions),
                edited_parts=tuple(moved(e) for e in layer.layer.edited_parts),
            )
            for layer in window
        ]


def _views(layer: LayerUnderTest) -> list[torch.Tensor]:
    """A layer's registered and edited views that hold bytes."""
    views = [r.view for r in layer.regions] + list(layer.edited_parts)
    return [v for v in views if v.numel()]


@dataclass(frozen=True)
class _Footprint:
    """The bytes one tile's fills and loads overwrite in each of its chunks.

    The registered regions, and every byte an edited view reaches (the
    rotated load moves a block's padding, or a spill into a sibling page,
    to the next block): per chunk, per storage, sorted disjoint ``[lo, hi)``
    byte intervals (a hull per view and chunk, so never fewer bytes than
    are touched).  ``flats`` holds each storage as ``uint8``.
    """

    flats: dict[int, torch.Tensor]
    chunks: tuple[dict[int, tuple[tuple[int, int], ...]], ...]

    @classmethod
    def of(cls, layers: Sequence[TiledLayer], chunks: list[tuple[int, slice]]) -> _Footprint:
        flats: dict[int, torch.Tensor] = {}
        shapes = []
        for layer in layers:
            for t in _views(layer.layer):
                key = t.untyped_storage().data_ptr()
                if key not in flats:
                    flats[key] = storage_bytes(t)
                word = t.element_size()
                extent = element_extent(tuple(t[0].shape), tuple(t[0].stride())) * word
                shapes.append((key, t.storage_offset() * word, t.stride(0) * word, extent))
        out = []
        for _, chunk in chunks:
            per: dict[int, list[tuple[int, int]]] = {}
            for key, off, step, extent in shapes:
                lo = off + chunk.start * step
                per.setdefault(key, []).append(
                    (lo, lo + (chunk.stop - chunk.start - 1) * step + extent)
                )
            out.append({key: _merged(pieces) for key, pieces in per.items()})
        return cls(flats, tuple(out))

    def saved_views(self, c: int) -> list[torch.Tensor]:
        """``uint8`` views of chunk ``c``'s bytes, as few as :func:`_strided` makes."""
        return [
            view
            for key, spans in self.chunks[c].items()
            for view in _strided(self.flats[key], spans)
        ]

    def nbytes(self, c: int) -> int:
        return sum(hi - lo for spans in self.chunks[c].values() for lo, hi in spans)


def _merged(pieces: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``[lo, hi)`` intervals sorted, those that overlap or touch made one."""
    pieces = sorted(pieces)
    merged = [list(pieces[0])]
    for lo, hi in pieces[1:]:
        if lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def _disjoint(footprints: Sequence[_Footprint]) -> bool:
    """No byte is overwritten by two (tile, chunk) steps of the run.

    Then the steps commute: each one's outcome depends only on its own
    bytes, so they can run in any order, at the same time, and find what a
    sequential run finds.  vLLM's own layouts always pass (a step is a run
    of blocks of a window of layers); an edited view that spills into a
    neighbour block or layer does not, and its run stays sequential.
    """
    intervals = sorted(
        (key, lo, hi)
        for footprint in footprints
        for per in footprint.chunks
        for key, spans in per.items()
        for lo, hi in spans
    )
    return all(
        a[0] != b[0] or b[1] >= a[2] for a, b in zip(intervals, intervals[1:], strict=False)
    )


def _strided(flat: torch.Tensor, spans: list[list[int]]) -> list[torch.Tensor]:
    """Disjoint sorted ``[lo, hi)`` byte spans of ``flat`` as few views as possible.

    Runs of equally long spans at a constant step (the same block of the
    layers of a window, ``layer_stride`` apart) become one ``[count,
    length]`` view, so saving and restoring them is one copy each.
    """
    views, at = [], 0
    while at < len(spans):
        lo, hi = spans[at]
        end = at + 1
        if end < len(spans):
            step = spans[end][0] - lo
            while (
                end < len(spans)
                and spans[end][1] - spans[end][0] == hi - lo
                and spans[end][0] - spans[end - 1][0] == step
            ):
                end += 1
        if end - at == 1:
            views.append(flat[lo:hi])
        else:
            views.append(flat.as_strided((end - at, hi - lo), (step, 1), lo))
        at = end
    return views


def exercise(
    layers: Sequence[LayerUnderTest],
    chosen: Sequence[int],
    chunk_bytes: int,
    restore: bool,
    kernel: str | None = None,
    threads: int | None = None,
    confined: bool = False,
) -> tuple[LayerDamage, ...]:
    """Fill, store / load elsewhere and compare: tile by tile, group by group.

    The outer loops run over tiles (see :func:`_tiling`) small enough to stay
    in cache; inside, each group in turn gets the whole cycle on the tile's
    layers (vLLM overlays groups on one backing allocation, so a group's fill
    overwrites the one before, unless the group's registered views are the
    previous group's and it starts from the pattern that group left; a
    group that repeats an earlier one view for view is run once for both,
    see :func:`_distinct`).  Every
    pass after the first then hits cache.  With ``restore`` the tiles run
    on replicas (:class:`_Replica`; every pass hits cache, and the cache is
    never written), or, where none can stand for a tile, its bytes in the
    cache are saved before and put back after, while hot.  ``confined``
    (the address checks found every edited view inside its page) lets a
    replica keep what the step before left outside the views; otherwise it
    is zeroed before every step.  Within a group, each stack
    of layers is one torch call per fill view and step, and one reduction
    checks the whole group.

    Words are compared (8 bytes at a time where the layout allows): a word
    differs iff one of its bytes does.  With the ``"xor"`` kernel (the
    CPU's) the words are ``xor``-ed into the (now free) store buffer and the
    largest byte of the result is taken (zero iff every byte matched); with
    ``"ne"`` (CUDA's) ``ne`` writes one byte per word and ``any`` reduces
    it.  Only a group whose check fails is then compared byte by byte, layer
    by layer, to count and locate the damage.

    ``threads``: CPU threads for the run (``None``: ``torch.get_num_threads()``).
    When a tile is a few pages of a mebibyte or more and no byte is
    overwritten by two steps (on replicas, or :func:`_disjoint`), each thread takes whole
    tiles, one after the other, on one intra-op thread and its own buffers
    (see :func:`_workers`); otherwise the tiles run in order and each torch
    call uses ``threads`` intra-op threads.  Returns
    one :class:`LayerDamage` per layer, in the order of ``layers``.
    """
    device = layers[0].device
    spans: dict = {}
    tiled = [TiledLayer.of(i, layer, spans) for i, layer in enumerate(layers)]
    tally = _Tally(len(tiled))
    members: dict[int, list[TiledLayer]] = {}
    for layer in tiled:
        members.setdefault(layer.layer.group, []).append(layer)
    step, window = _tiling(members, chunk_bytes)
    chunks = _chunks(chosen, step)
    widest = max(len(m) for m in members.values())
    windows = [
        [layer for g in sorted(members) for layer in members[g][w : w + window]]
        for w in range(0, widest, window)
    ]
    steps = [(c, t) for c in range(len(chunks)) for t in range(len(windows))]
    page = max(_block_bytes(layer) for layer in tiled)
    count = _workers(device, threads, len(steps), page)
    most = max(chunk.stop - chunk.start for _, chunk in chunks)
    replica = _Replica.of(windows, most, device) if restore else None
    footprints = []
    if replica is None and (restore or count > 1):
        footprints = [_Footprint.of(tile, chunks) for tile in windows]
        if count > 1 and not _disjoint(footprints):
            count = 1
    kernel = kernel or compare_kernel(device)
    groups_of = sorted(members)

    def build(buffers: list[torch.Tensor] | None = None):
        """The tiles' groups, on ``buffers`` (a worker's replica) when given."""
        tiles = []
        for t, tile in enumerate(windows):
            if buffers is not None:
                spans: dict = {}
                tile = [
                    TiledLayer.of(layer.position, moved, spans)
                    for layer, moved in zip(tile, replica.layers(t, tile, buffers), strict=True)
                ]
            tiles.append(
                [
                    Group([x for x in tile if x.layer.group == g], kernel, buffers is not None)
                    for g in groups_of
                ]
            )
        # Largest fills first: a later group whose fills they hold skips its own.
        return _distinct(
            [
                sorted(
                    (group for group in tile if group.stacks),
                    key=Group.fill_bytes,
                    reverse=True,
                )
                for tile in tiles
            ]
        )

    buffers = None if replica is None else replica.buffers()
    tiles, twins = build(buffers)
    groups = [group for tile in tiles for group in tile]
    deepest = max(len(s.layers) for g in groups for s in g.stacks)
    reach = max(
        pattern_bytes(v)
        for layer in tiled
        for r in layer.regions + layer.fills
        for v in (r.view, r.wide)
    )
    ramp = _ramp(reach + _PERIOD + _BLOCK_BYTES * most + _LAYER_BYTES * deepest, device)
    ramps = _Patterns(ramp)
    scratch_bytes = _aligned(max(g.scratch_bytes(most) for g in groups))
    saved_bytes = 0
    if footprints and restore:
        saved_bytes = max(f.nbytes(c) for f in footprints for c in range(len(chunks)))
    run = _Run(
        chunks, ramps, footprints if restore else [], tally, _Steps(steps),
        scratch_bytes, saved_bytes, device, replica is not None and not confined,
    )
    if count == 1:
        with _threads(device, threads):
            run.work(tiles, buffers)
    else:

        def own() -> tuple[list[list[Group]], list[torch.Tensor] | None]:
            mine = None if replica is None else replica.buffers()
            return build(mine)[0], mine

        run.together(count, (tiles, buffers), own)
    for source, twin in twins:
        tally.repeat(source, twin)
    return tally.damage()


def _workers(device: torch.device, threads: int | None, steps: int, page: int) -> int:
    """How many threads take tiles at once: 1, or ``threads`` (torch's for ``None``).

    Threads share the tiles on the CPU when a layer's block is at least
    :data:`_SEGMENT_BYTES` (``page``: the largest, in bytes), so a tile is a
    few large pages; otherwise the tiles run in order, each torch call split
    over the threads.  Both were measured on ``benchmarks/bench_edits.py``'s
    two layouts on 2 shared cores, 9 runs alternating in one process,
    ``restore=True``, median seconds: Qwen3.5-0.8B x 64 blocks on the H100
    (1,179,648-byte pages, three blocks of one layer per tile) 0.279 with
    threads sharing tiles against 0.376 in order; the 1 GiB registration
    (32 KiB pages, 64 blocks of two layers per tile) 0.376 against 0.306.
    On the model's layout every call in order also waits at a barrier for
    the slower thread, which on a shared machine is often descheduled or
    sharing its core: with another process streaming 64 MiB copies on one
    core, copy seconds / verify seconds went from 0.15-0.21 (worst
    0.14-0.18) to 0.54-0.92 (0.44-0.64), median of 5 runs per process.
    On replicas, with the views of a step cut once, the model's row was
    measured again (four processes, 7-9 runs each, median seconds, threads
    sharing tiles / in order on two threads / one thread): 0.193 / 0.147 /
    0.167, 0.156 / 0.121 / 0.146, 0.222 / 0.176 / 0.174 and 0.198 / 0.304
    / 0.170: in order is faster while the second core is free and far
    slower when it is not, so the rule stands.
    In the cache, the caller checks that the tiles' bytes are disjoint
    (:func:`_disjoint`).
    """
    if device.type != "cpu" or page < _SEGMENT_BYTES:
        return 1
    wanted = torch.get_num_threads() if threads is None else threads
    return max(1, min(wanted, steps))


class _Steps:
    """The ``(chunk, tile)`` steps of a run, handed out one at a time to whoever asks."""

    def __init__(self, steps: list[tuple[int, int]]) -> None:
        self._steps = steps
        self._next = 0
        self._lock = threading.Lock()
        self.stopped = False

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            if self.stopped or self._next >= len(self._steps):
                return None
            self._next += 1
            return self._steps[self._next - 1]


@dataclass(frozen=True)
class _Run:
    """What every worker of a run shares; each brings its own groups and buffers."""

    chunks: list[tuple[int, slice]]
    ramps: dict
    footprints: list[_Footprint]  # per tile; empty unless restoring
    tally: _Tally
    steps: _Steps
    scratch_bytes: int
    saved_bytes: int
    device: torch.device
    #: Zero a replica before every step: some edited view reaches bytes of
    #: another page, which would otherwise still hold an earlier step's.
    wipe: bool = False

    def work(self, tiles: list[list[Group]], replica: list[torch.Tensor] | None = None) -> None:
        """Take steps until none is left.

        On ``replica`` (the buffers ``tiles`` were built on, see
        :class:`_Replica`) a step is its groups on the replica's first
        blocks; on the cache, its bytes are saved before (when restoring)
        and put back after.
        """
        # One allocation for the store buffer and the saved bytes.
        buffer = torch.empty(
            self.scratch_bytes + self.saved_bytes, dtype=torch.uint8, device=self.device
        )
        scratch, saved = buffer[: self.scratch_bytes], buffer[self.scratch_bytes :]
        while (step := self.steps.take()) is not None:
            c, t = step
            lo, chunk = self.chunks[c]
            if replica is not None:
                if self.wipe:
                    for flat in replica:
                        flat.zero_()
                n = chunk.stop - chunk.start
                _run_tile(tiles[t], lo, slice(0, n), self.ramps, scratch, self.tally, chunk.start)
                continue
            kept = []
            if self.footprints:
                cursor = 0
                for target in self.footprints[t].saved_views(c):
                    size = target.numel()
                    keep = saved[cursor : cursor + size].view(target.shape)
                    keep.copy_(target)
                    kept.append((target, keep))
                    cursor += size
            try:
                _run_tile(tiles[t], lo, chunk, self.ramps, scratch, self.tally)
            finally:
                for target, keep in kept:
                    target.copy_(keep)

    def together(self, count: int, mine: tuple, build) -> None:
        """``count`` workers on one intra-op thread each; this thread is the first.

        ``mine``: this thread's ``(tiles, replica)`` for :meth:`work`; the
        others call ``build`` for their own (a group caches views of its
        worker's buffers).  An error in any worker stops the others after
        their current step and is raised here.
        """
        errors: list[BaseException] = []

        def helper() -> None:
            try:
                torch.set_num_threads(1)  # this thread's own setting
                self.work(*build())
            except BaseException as exc:  # handed to the calling thread
                self.steps.stopped = True
                errors.append(exc)

        helpers = [threading.Thread(target=helper, daemon=True) for _ in range(count - 1)]
        with _threads(self.device, 1):
            for thread in helpers:
                thread.start()
            try:
                self.work(*mine)
            except BaseException:
                self.steps.stopped = True
                raise
            finally:
                for thread in helpers:
                    thread.join()
        if errors:
            raise errors[0]


def _run_tile(
    tile: list[Group],
    lo: int,
    chunk: slice,
    ramps: dict,
    scratch: torch.Tensor,
    tally: _Tally,
    first: int | None = None,
) -> None:
    """Every group of a tile in turn, each starting from what the one before left.

    ``first``: the block id of the chunk's first block, for reports.
    """
    carry = None
    for group in tile:
        carry = group.run(lo, chunk, ramps, scratch, tally, carry, first)


def _distinct(tiles: list[list[Group]]) -> tuple[list[list[Group]], list[tuple[int, int]]]:
    """Each tile's groups less those that repeat an earlier one (:meth:`Group.identity`).

    Returns the groups to run and ``(source, twin)`` layer positions: the
    twin's damage is its source's, found by the very same torch calls.
    """
    kept, twins = [], []
    for tile in tiles:
        seen: dict[tuple, Group] = {}
        for group in tile:
            source = seen.setdefault(group.identity(), group)
            if source is not group:
                twins += [
                    (a.position, b.position)
                    for a, b in zip(source.layers, group.layers, strict=True)
                ]
        kept.append(list(seen.values()))
    return kept, twins
