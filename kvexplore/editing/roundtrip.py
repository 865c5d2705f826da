"""Byte-exact proof that a store and a load through edited views lose nothing.

:func:`verify_roundtrip` saves blocks through the edited views, frees them and
loads them into other blocks, as an LMCache-style connector does, and reports
per layer the data check next to :mod:`kvexplore.editing.proof`'s address
checks (mismatches are reported, never raised).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig

from kvexplore.display import Displayable
from kvexplore.editing.proof import (
    AddressCheck,
    LayerUnderTest,
    address_checks,
    layers_under_test,
    selection,
)
from kvexplore.editing.registered import RegisteredKVCache
from kvexplore.editing.validation import as_kv_cache_config
from kvexplore.errors import KVExploreError
from kvexplore.layout import check_int, element_extent

__all__ = ["LayerVerdict", "RoundTripReport", "default_chunk_bytes", "verify_roundtrip"]

_COLUMNS = [
    "group", "layer", "edited", "regions", "blocks", "bytes",
    "roundtrip_ok", "mismatched_bytes", "first_mismatch",
    "covers_ok", "uncovered_bytes", "confined_ok", "disjoint_ok", "ok", "detail",
]  # fmt: skip

# Pattern byte = 1 + (pos + 37 * layer + 97 * block + 53 * region) % 251.
_MODULUS = 251
_LAYER_STEP, _BLOCK_STEP, _REGION_STEP = 37, 97, 53


@dataclass
class _Found:
    """What the data check found for one layer so far."""

    mismatched: int = 0
    first: tuple[int, int, int] | None = None  # (block, region index, byte)
    error: str | None = None


@dataclass(frozen=True)
class LayerVerdict:
    """One layer's outcome: one row of :attr:`RoundTripReport.table`.

    ``first_mismatch``: ``(block, region label, byte in the region's block)``
    of the earliest wrong byte; ``covers_ok`` is False also when torch could
    not store or load through the edited view at all.
    """

    group: int
    layer: str
    edited: bool
    regions: str
    blocks: int
    bytes: int
    roundtrip_ok: bool
    mismatched_bytes: int
    first_mismatch: tuple[int, str, int] | None
    covers_ok: bool
    uncovered_bytes: int
    confined_ok: bool
    disjoint_ok: bool
    detail: str

    @property
    def ok(self) -> bool:
        return all(
            (self.roundtrip_ok, self.covers_ok, self.confined_ok, self.disjoint_ok)
        )

    @classmethod
    def of(
        cls, layer: LayerUnderTest, blocks: int, check: AddressCheck, found: _Found
    ) -> LayerVerdict:
        first, notes = None, list(check.notes)
        if found.error is not None:
            notes.append(f"edited view cannot be stored/loaded: {found.error}")
        if found.first is not None:
            block, region, byte = found.first
            first = (block, layer.regions[region].label, byte)
            notes.append(
                f"{found.mismatched} bytes differ after the round trip; "
                f"first at block {block}, {first[1]} byte {byte}"
            )
        return cls(
            group=layer.group,
            layer=layer.name,
            edited=layer.edited,
            regions=",".join(r.label for r in layer.regions),
            blocks=blocks,
            bytes=sum(r.view[0].numel() for r in layer.regions) * blocks,
            roundtrip_ok=found.mismatched == 0,
            mismatched_bytes=found.mismatched,
            first_mismatch=first,
            covers_ok=check.covers_ok and found.error is None,
            uncovered_bytes=check.uncovered_bytes,
            confined_ok=check.confined_ok,
            disjoint_ok=check.disjoint_ok,
            detail="; ".join(notes or ["every byte came back"]),
        )

    def row(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in _COLUMNS}


@dataclass(frozen=True)
class RoundTripReport(Displayable):
    """Per-layer outcome of :func:`verify_roundtrip` (frozen): ``table`` (a
    new DataFrame each access) has one :class:`LayerVerdict` row per layer;
    ``ok`` is the conjunction over all layers; ``seconds`` (wall time)
    appears in no text form.
    """

    layers: tuple[LayerVerdict, ...]
    seconds: float
    device: str

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame([v.row() for v in self.layers], columns=_COLUMNS)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.layers)

    @property
    def bytes_checked(self) -> int:
        return sum(v.bytes for v in self.layers)

    def by_group(self) -> pd.DataFrame:
        """One row per group: layers, bytes, and whether all of them passed."""
        return (
            self.table.groupby("group", sort=True)
            .agg(layers=("layer", "count"), bytes=("bytes", "sum"), ok=("ok", "all"))
            .reset_index()
        )

    def failures(self) -> pd.DataFrame:
        """The rows of the layers that failed any check."""
        table = self.table
        return table[~table["ok"].astype(bool)]

    def summary(self) -> str:
        """One line: verdict, layers, bytes and device (no timing)."""
        failed = sum(not v.ok for v in self.layers)
        verdict = "OK" if not failed else f"FAILED on {failed} layer(s)"
        return (
            f"RoundTripReport({verdict}: {len(self.layers)} layers, "
            f"{self.bytes_checked} bytes on {self.device})"
        )

    def __repr__(self) -> str:
        return self.text()


def default_chunk_bytes(device: torch.device) -> int:
    """Registered bytes of one group a step: 16 MiB on the CPU, 256 MiB on CUDA."""
    return (256 << 20) if device.type == "cuda" else (16 << 20)


def _chunks(chosen: Sequence[int], most: int) -> list[tuple[int, int]]:
    """Runs ``(start, stop)`` of consecutive ids, at most ``max(1, most)`` blocks.

    ``[4, 1, 2]`` with ``most=8`` -> ``[(1, 3), (4, 5)]``.
    """
    runs: list[list[int]] = []
    for block in sorted(chosen):
        if runs and runs[-1][1] == block and block - runs[-1][0] < most:
            runs[-1][1] = block + 1
        else:
            runs.append([block, block + 1])
    return [(start, stop) for start, stop in runs]


def _patterns(
    layer: LayerUnderTest, start: int, stop: int, ramp: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per region: its bytes in blocks ``[start, stop)`` and their pattern (views).

    The pattern reads ``ramp[i] = 1 + i % 251`` with the region's strides
    modulo 251: byte ``pos`` (from the layer's first registered byte) of
    block ``b`` of region ``k`` of the layer at ``index`` in its group reads
    ``1 + (pos + 37 index + 97 b + 53 k) % 251``.
    """
    base = min(r.view.storage_offset() for r in layer.regions)
    out = []
    for k, r in enumerate(layer.regions):
        view = r.view[start:stop]
        tag = r.view.storage_offset() - base
        tag += _LAYER_STEP * layer.index + _BLOCK_STEP * start + _REGION_STEP * k
        strides = (_BLOCK_STEP, *(s % _MODULUS for s in view.stride()[1:]))
        out.append((view, ramp.as_strided(view.shape, strides, tag % _MODULUS)))
    return out


def _ramp(
    layers: Sequence[LayerUnderTest], most: int, device: torch.device
) -> torch.Tensor:
    """``1 + i % 251`` as ``uint8``, long enough for ``most`` blocks of patterns."""
    reach = max(
        element_extent(r.view.shape[1:], [s % _MODULUS for s in r.view.stride()[1:]])
        for layer in layers
        for r in layer.regions
    )
    length = _MODULUS + _BLOCK_STEP * (most - 1) + reach
    return (torch.arange(length, device=device) % _MODULUS + 1).to(torch.uint8)


def _save(
    layers: Sequence[LayerUnderTest], start: int, stop: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(view, copy)`` for every registered and edited view of the layers in
    blocks ``[start, stop)``, copied before anything is written: every byte a
    round trip can write is in one of them."""
    return [
        (part, part.clone())
        for layer in layers
        for part in (
            t[start:stop]
            for t in [*(r.view for r in layer.regions), *layer.edited_parts]
        )
    ]


def _put_back(saved: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Write every saved copy back, but through a view whose elements overlap
    each other: torch refuses to write through one before writing anything,
    so there is nothing to put back."""
    for view, copy in reversed(saved):
        try:
            view.copy_(copy)
        except RuntimeError as error:
            if "more than one element of the written-to tensor" not in str(error):
                raise


def _compare(
    got: torch.Tensor, want: torch.Tensor, block0: int, k: int, found: _Found
) -> None:
    """Count the bytes of ``got`` (block ``block0`` first) that differ from ``want``."""
    if got.numel() == 0 or not int(torch.bitwise_xor(got, want).flatten().max()):
        return
    wrong = torch.ne(got, want).reshape(got.shape[0], -1)
    found.mismatched += int(torch.count_nonzero(wrong))
    block, byte = torch.nonzero(wrong)[0].tolist()
    key = (block0 + block, k, byte)
    if found.first is None or key < found.first:
        found.first = key


def _round_trip(
    layers: Sequence[LayerUnderTest],
    start: int,
    stop: int,
    ramp: torch.Tensor,
    restore: bool,
    found: Mapping[str, _Found],
) -> None:
    """Fill, store, zero, load, compare blocks ``[start, stop)`` of one group.

    Block ``start + i`` is loaded into ``start + (i + 1) % n``.  With
    ``restore`` the bytes the views reach are put back, also on an exception.
    """
    n = stop - start
    saved = _save(layers, start, stop) if restore else []
    try:
        regions = [_patterns(layer, start, stop, ramp) for layer in layers]
        for pairs in regions:
            for view, pattern in pairs:
                view.copy_(pattern)
        stored: list[list[torch.Tensor]] = []
        for layer in layers:
            try:
                stored.append([part[start:stop].clone() for part in layer.edited_parts])
            except RuntimeError as error:
                found[layer.name].error = found[layer.name].error or str(error)
                stored.append([])
        for pairs in regions:
            for view, _ in pairs:
                view.zero_()
        for layer, copies in zip(layers, stored, strict=True):
            try:
                for part, copy in zip(layer.edited_parts, copies, strict=False):
                    part[start + 1 : stop].copy_(copy[: n - 1])
                    part[start : start + 1].copy_(copy[n - 1 :])
            except RuntimeError as error:
                found[layer.name].error = found[layer.name].error or str(error)
        for layer, pairs in zip(layers, regions, strict=True):
            for k, (got, want) in enumerate(pairs):
                _compare(got[1:], want[: n - 1], start + 1, k, found[layer.name])
                _compare(got[:1], want[n - 1 :], start, k, found[layer.name])
    finally:
        _put_back(saved)


def verify_roundtrip(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
    *,
    blocks: Sequence[int] | None = None,
    restore: bool = True,
    chunk_bytes: int | None = None,
) -> RoundTripReport:
    """Store every selected block through ``edited``, load it into another, check it.

    Per group and chunk of consecutive selected blocks: every registered byte
    gets a pattern of its place, layer, block and region; the edited views
    store the chunk, the registered bytes are zeroed, and the edited views
    load block ``i`` into block ``i + 1`` of the chunk (cyclically), as a
    connector reloads a saved block wherever there is room; every registered
    byte must then hold its source block's pattern.  E.g. ``[:, :500]`` of
    the Qwen3.5-0.8B GDN view ``[64, 544, 1, 2000]`` loses the last 85,440
    state bytes of each page.

    Args:
        kv_cache_config: the vLLM ``KVCacheConfig`` (or its ``Plan``).
        kv_caches: the registered caches (what vLLM hands a connector).
        edited: e.g. :func:`apply_kv_cache_group_edits`'s result.
        blocks: block ids to exercise; ``None`` for all ``num_blocks``.
        restore: put back the bytes each chunk's views reach, also on an
            exception; ``False`` leaves the patterns.
        chunk_bytes: registered bytes of one group a step (at least one
            block); ``None`` for :func:`default_chunk_bytes`.

    A mismatch, or an edited view torch cannot store or load through, is
    reported, not raised.  Refused, naming the value: inputs that are not
    one registration (:func:`~kvexplore.editing.proof.layers_under_test`),
    an unusable ``blocks``, a ``chunk_bytes`` that is not a positive int.
    """
    kv_cache_config = as_kv_cache_config(kv_cache_config)
    if kv_cache_config is None:
        raise KVExploreError(
            "kv_cache_config is None; expected the vLLM KVCacheConfig the caches were "
            "built for (or their kvexplore.Plan)"
        )
    check_int("chunk_bytes", chunk_bytes, minimum=1, allow_none=True)
    started = time.perf_counter()
    num_blocks = int(kv_cache_config.num_blocks)
    chosen = selection(blocks, num_blocks)
    layers = layers_under_test(kv_cache_config, kv_caches, edited)
    if not layers:
        return RoundTripReport((), 0.0, "cpu")
    device = layers[0].regions[0].view.device
    checks = address_checks(layers, chosen, num_blocks)
    found = {layer.name: _Found() for layer in layers}
    for group in sorted({layer.group for layer in layers}):
        members = [layer for layer in layers if layer.group == group]
        per_block = sum(r.view[0].numel() for layer in members for r in layer.regions)
        most = (chunk_bytes or default_chunk_bytes(device)) // max(1, per_block)
        runs = _chunks(chosen, most)
        ramp = _ramp(members, max(stop - start for start, stop in runs), device)
        for start, stop in runs:
            _round_trip(members, start, stop, ramp, restore, found)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    verdicts = tuple(
        LayerVerdict.of(layer, len(chosen), check, found[layer.name])
        for layer, check in zip(layers, checks, strict=True)
    )
    return RoundTripReport(verdicts, time.perf_counter() - started, str(device))
