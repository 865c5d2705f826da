"""The address half of the round-trip proof: what is checked, by arithmetic alone.

:func:`layers_under_test` names each layer's registered bytes as
:class:`Region` views (``conv`` / ``ssm`` of a Mamba page, ``K`` / ``V`` of an
attention page: :func:`kvexplore.pages.page_regions`) next to its edited tensors, both ``[num_blocks, ...]``;
:func:`address_checks` proves from sizes, strides and storage offsets that
the edited view of a block covers its registered bytes, stays inside its
page and that no two pages of a group overlap.  E.g. a Qwen3.5-0.8B unified GDN row
``[64, 1, 1, 1085440]`` int8 is ``conv`` (36,864 B) and ``ssm`` (1,048,576 B)
per block; its edited ``[64, 544, 1, 2000]`` covers both and spills 2,560 B
into the page padding, inside the page.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

from kvexplore.editing.registered import (
    RegisteredKVCache,
    check_registration,
    tensors_of,
)
from kvexplore.errors import KVExploreError
from kvexplore.layout import page_bytes as spec_page_bytes
from kvexplore.pages import by_block, page_regions


@dataclass(frozen=True)
class Region:
    """One named part of a layer's registered bytes, as ``uint8 [num_blocks, ...]``."""

    label: str
    view: torch.Tensor


@dataclass(frozen=True)
class LayerUnderTest:
    """A layer's registered regions and edited tensors, both by block.

    ``index`` is the layer's position in its group; ``edited`` is False when
    the edits handed back the registered object itself.
    """

    group: int
    index: int
    name: str
    spec: KVCacheSpec
    regions: tuple[Region, ...]
    edited_parts: tuple[torch.Tensor, ...]
    edited: bool


@dataclass(frozen=True)
class AddressCheck:
    """What address arithmetic proves for one layer over the selected blocks."""

    covers_ok: bool
    uncovered_bytes: int
    confined_ok: bool
    disjoint_ok: bool
    notes: tuple[str, ...] = ()


def selection(blocks: object, num_blocks: int) -> list[int]:
    """The block ids to exercise: all for ``None``, else distinct ids in range,
    from a sequence, ``range``, numpy array or tensor of integers (numpy and
    torch integer scalars count as ints)."""
    if blocks is None:
        return list(range(num_blocks))
    if hasattr(blocks, "tolist") and not isinstance(blocks, (list, tuple)):
        blocks = blocks.tolist()  # numpy arrays and tensors
    if isinstance(blocks, Sequence) and not isinstance(blocks, (str, bytes)):
        chosen = list(blocks)
    else:
        raise KVExploreError(
            f"blocks is a {type(blocks).__name__}; expected None or a sequence of "
            f"block ids in [0, {num_blocks})"
        )
    chosen = [
        int(b) if isinstance(b, numbers.Integral) and not isinstance(b, bool) else b
        for b in chosen
    ]
    bad = [
        b
        for b in chosen
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < num_blocks
    ]
    if bad or len(set(chosen)) != len(chosen) or not chosen:
        raise KVExploreError(
            f"blocks={chosen[:8]} holds {bad[:4] or 'duplicates or nothing'}; "
            f"expected distinct block ids in [0, {num_blocks})"
        )
    return chosen


def layers_under_test(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
) -> tuple[LayerUnderTest, ...]:
    """Every layer of the registration, checked against the config and ``edited``.

    Refused: what :func:`check_registration` refuses, an ``edited`` that
    names other layers, holds something that is not a tensor or a tensor
    list or lives on another device, caches on the meta device (no bytes to
    store or load), and a leading dim of whole blocks.
    """
    where = check_registration(kv_cache_config, kv_caches)
    if not isinstance(edited, Mapping) or set(edited) != set(kv_caches):
        got = sorted(edited) if isinstance(edited, Mapping) else type(edited).__name__
        raise KVExploreError(
            f"edited holds {got!s:.200}; expected exactly the layers of kv_caches "
            "(pass the result of apply_kv_cache_group_edits)"
        )
    num_blocks = kv_cache_config.num_blocks
    layers: list[LayerUnderTest] = []
    per_group: dict[int, int] = {}
    for name, value in kv_caches.items():
        group, spec = where[name]
        new = edited[name]
        parts = tensors_of(new)
        if not parts:
            raise KVExploreError(
                f"edited[{name!r}] is a {type(new).__name__}; expected a tensor or "
                "a list of tensors"
            )
        device = tensors_of(value)[0].device
        if device.type == "meta":
            raise KVExploreError(
                f"layer {name!r} is registered on the meta device, which holds no bytes; "
                "expected caches on cpu or cuda (allocate(plan, device='cpu'))"
            )
        if any(t.device != device for t in parts):
            raise KVExploreError(
                f"edited[{name!r}] is on {parts[0].device}, the registered cache on "
                f"{device}; expected the same device"
            )
        index = per_group.get(group, 0)
        per_group[group] = index + 1
        layers.append(
            LayerUnderTest(
                group=group,
                index=index,
                name=name,
                spec=spec,
                regions=tuple(
                    Region(label, view)
                    for label, view in page_regions(spec, value, num_blocks, name)
                ),
                edited_parts=tuple(
                    by_block(t, num_blocks, f"edited[{name!r}]") for t in parts
                ),
                edited=new is not value,
            )
        )
    return tuple(layers)


def block_runs(blocks: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Byte runs of blocks ``which`` of ``blocks`` (dim 0 = block), on the CPU.

    Returns ``(starts, run_bytes)``: ``[len(which), runs]`` absolute byte
    offsets into the storage, every run ``run_bytes`` long.  Dims merge
    innermost-first while contiguous, so a dense page is one run.
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


def union_bytes(parts: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Per row: how many distinct bytes the runs of ``parts`` cover together.

    Sorted by start, run ``i`` adds ``max(0, end_i - max(start_i, reach))``,
    ``reach`` being the furthest end of the runs before it.
    """
    starts = torch.cat([s for s, _ in parts], dim=1)
    ends = torch.cat([s + n for s, n in parts], dim=1)
    order = starts.argsort(dim=1)
    starts = starts.gather(1, order)
    ends = ends.gather(1, order)
    reach = ends.cummax(dim=1).values
    before = torch.cat([starts[:, :1], reach[:, :-1]], dim=1)
    return (ends - torch.maximum(starts, before)).clamp(min=0).sum(dim=1)


#: One layer's page intervals: ``(starts, ends, layer position)``, one per block or per run.
_Pages = tuple[torch.Tensor, torch.Tensor, int]


def _coverage(
    layer: LayerUnderTest, idx: torch.Tensor, num_blocks: int, position: int
) -> tuple[AddressCheck, list[_Pages], int]:
    """Coverage and confinement of one layer (``disjoint_ok`` still True), the
    page intervals of all its blocks, and the storage they lie on."""
    regions = [r.view for r in layer.regions]
    storage = regions[0].untyped_storage().data_ptr()
    same_storage = all(
        e.untyped_storage().data_ptr() == storage for e in layer.edited_parts
    )
    reg_runs = [block_runs(r, idx) for r in regions]
    edit_runs = [block_runs(e, idx) for e in layer.edited_parts]
    reg_bytes = union_bytes(reg_runs)
    all_bytes = union_bytes(reg_runs + edit_runs)
    # bytes of the registered union outside the edited union
    uncovered = all_bytes - union_bytes(edit_runs) if same_storage else reg_bytes
    page = spec_page_bytes(layer.spec)
    runs = [block_runs(r, torch.arange(num_blocks)) for r in regions]
    first = torch.cat([s for s, _ in runs], 1).amin(1)
    hull = torch.cat([s + n for s, n in runs], 1).amax(1) - first
    if bool((hull <= page).all()):
        pages = [(first, first + page, position)]
        e_lo = torch.cat([s for s, _ in edit_runs], 1).amin(1)
        e_hi = torch.cat([s + n for s, n in edit_runs], 1).amax(1)
        confined = (e_lo >= first[idx]) & (e_hi <= first[idx] + page)
    else:
        # No single page interval (e.g. heads outside blocks): the layer's
        # bytes of a block are exactly its registered runs.
        pages = [(s.reshape(-1), s.reshape(-1) + n, position) for s, n in runs]
        confined = all_bytes == reg_bytes
    confined = confined & same_storage
    covers = (uncovered == 0) & same_storage
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
    check = AddressCheck(
        covers_ok=bool(covers.all()),
        uncovered_bytes=int(uncovered.sum()),
        confined_ok=bool(confined.all()),
        disjoint_ok=True,
        notes=tuple(notes),
    )
    return check, pages, storage


def _overlaps(
    entries: list[_Pages], num_blocks: int, names: Sequence[str]
) -> dict[int, list[str]]:
    """Per layer position: notes on the pages of one storage that overlap."""
    starts = torch.cat([s for s, _, _ in entries])
    ends = torch.cat([e for _, e, _ in entries])
    owner = torch.cat([torch.full_like(s, layer) for s, _, layer in entries])
    block = torch.cat([torch.arange(s.numel()) % num_blocks for s, _, _ in entries])
    order = starts.argsort()
    starts, ends, owner, block = starts[order], ends[order], owner[order], block[order]
    reach = ends.cummax(0).values
    clash = torch.nonzero(starts[1:] < reach[:-1]).reshape(-1)
    found: dict[int, list[str]] = {}
    for k in clash[:16].tolist():
        a, b = int(owner[k + 1]), int(owner[k])
        for li, other, at in ((a, b, k + 1), (b, a, k)):
            found.setdefault(li, []).append(
                f"page of block {int(block[at])} overlaps {names[other]!r}"
            )
    return found


def address_checks(
    layers: Sequence[LayerUnderTest], chosen: Sequence[int], num_blocks: int
) -> tuple[AddressCheck, ...]:
    """Coverage, confinement and disjoint pages of every layer (CPU only).

    Per selected block ``b``: ``uncovered_bytes`` counts the registered bytes
    of ``b`` the edited view of ``b`` misses (all of them on other storage);
    ``confined_ok``: that view stays inside ``b``'s page (without one page
    interval per block, inside ``b``'s registered bytes); ``disjoint_ok``: no
    page of the layer, selected or not, overlaps another of its group.
    """
    idx = torch.tensor(list(chosen), dtype=torch.int64)
    checks: list[AddressCheck] = []
    pages: dict[tuple[int, int], list[_Pages]] = {}
    for position, layer in enumerate(layers):
        check, intervals, storage = _coverage(layer, idx, num_blocks, position)
        checks.append(check)
        pages.setdefault((layer.group, storage), []).extend(intervals)
    names = [layer.name for layer in layers]
    clashes: dict[int, list[str]] = {}
    for entries in pages.values():
        for li, notes in _overlaps(entries, num_blocks, names).items():
            clashes.setdefault(li, []).extend(notes)
    return tuple(
        replace(
            c, disjoint_ok=li not in clashes, notes=c.notes + tuple(clashes.get(li, ()))
        )
        for li, c in enumerate(checks)
    )
