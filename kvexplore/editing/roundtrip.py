"""Byte-exact proof that a store and a load through edited views lose nothing.

:func:`verify_roundtrip` plays what an LMCache-style connector does with the
result of :func:`kvexplore.apply_kv_cache_group_edits` and reports, per
layer, in a frozen :class:`RoundTripReport`.  It joins the two halves of
the proof:

* :mod:`kvexplore.editing.proof`, address arithmetic: the edited view of
  every selected block covers every registered byte of that block on the
  same storage, stays inside that block's page, and no two pages of a group
  overlap;
* :mod:`kvexplore.editing.tiling`, data: a pattern written through the
  registered views, stored and loaded through the edited views into another
  block (as a connector reloads a saved block wherever there is room), is
  found byte for byte in that block, tile by cache-sized tile.

Mismatches never raise: the report says where.
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
    check_chunk_bytes,
    layers_under_test,
    selection,
)
from kvexplore.editing.rules import RegisteredKVCache
from kvexplore.editing.tiling import LayerDamage, default_chunk_bytes, exercise
from kvexplore.errors import KVExploreError
from kvexplore.layout import check_int

__all__ = ["LayerVerdict", "RoundTripReport", "verify_roundtrip"]

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
    "checked_with",
]


@dataclass(frozen=True)
class LayerVerdict:
    """One layer's outcome: one row of :attr:`RoundTripReport.table`.

    ``first_mismatch`` is ``(block, region, byte)``; ``covers_ok`` is False
    also when torch could not store or load through the edited view at all.
    ``checked_with`` names the layer whose run stands for this one's data
    check (its group's registered and edited views are, view for view,
    that layer's group's, on the same bytes); ``None`` when this layer's
    own bytes were moved and compared.  Its address checks are always its own.
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
    checked_with: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.roundtrip_ok and self.covers_ok and self.confined_ok and self.disjoint_ok
        )

    @classmethod
    def of(
        cls,
        layer: LayerUnderTest,
        blocks: int,
        check: AddressCheck,
        damage: LayerDamage,
        checked_with: str | None = None,
    ) -> LayerVerdict:
        notes = list(check.notes)
        if damage.store_error is not None:
            notes.append(f"edited view cannot be stored/loaded: {damage.store_error}")
        if damage.mismatched_bytes:
            block, label, byte = damage.first_mismatch or (None, None, None)
            notes.append(
                f"{damage.mismatched_bytes} bytes differ after the round trip; "
                f"first at block {block}, {label} byte {byte}"
            )
        if not notes:
            notes.append("every byte came back")
        if checked_with is not None:
            notes.append(f"data checked once with {checked_with} (the same views of the same bytes)")
        return cls(
            group=layer.group,
            layer=layer.name,
            edited=layer.edited,
            regions=",".join(r.label for r in layer.regions),
            blocks=blocks,
            bytes=sum(r.view[0].numel() for r in layer.regions) * blocks,
            roundtrip_ok=damage.mismatched_bytes == 0,
            mismatched_bytes=damage.mismatched_bytes,
            first_mismatch=damage.first_mismatch,
            covers_ok=check.covers_ok and damage.store_error is None,
            uncovered_bytes=check.uncovered_bytes,
            confined_ok=check.confined_ok,
            disjoint_ok=check.disjoint_ok,
            detail="; ".join(notes),
            checked_with=checked_with,
        )

    def row(self) -> dict[str, object]:
        return {
            **{name: getattr(self, name) for name in _COLUMNS if name != "ok"},
            "ok": self.ok,
        }


@dataclass(frozen=True)
class RoundTripReport(Displayable):
    """Per-layer outcome of :func:`verify_roundtrip` (frozen).

    ``table`` (a new DataFrame on every access) has one row per layer:
    whether every byte came back (``roundtrip_ok``, ``mismatched_bytes``,
    ``first_mismatch`` as ``(block, region, byte)``), whether the edited view
    of each block covers every registered byte of that block on the same
    storage (``covers_ok``, by address arithmetic; ``uncovered_bytes`` counts
    the misses), whether it stays inside that block's page of the layer
    (``confined_ok``) and whether the group's pages overlap nowhere
    (``disjoint_ok``).  ``ok`` is the conjunction over all layers.
    ``seconds`` is wall time and appears in no text form.
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


def verify_roundtrip(
    kv_cache_config: KVCacheConfig,
    kv_caches: Mapping[str, RegisteredKVCache],
    edited: Mapping[str, RegisteredKVCache],
    *,
    blocks: Sequence[int] | None = None,
    restore: bool = True,
    chunk_bytes: int | None = None,
    threads: int | None = None,
) -> RoundTripReport:
    """Store every selected block through ``edited``, load it into another, check every byte.

    Every registered byte gets a pattern of its layer, block and place in the
    page; the edited views then move each block's bytes to another block of
    the same layer (as a connector reloads a saved block wherever there is
    room; in a tile of one block, to the same block of another layer of the
    group; for a tile of one layer of one block, back to the same block
    after its bytes are zeroed), and every registered byte must hold the
    pattern of the block it came from.  A byte the edited view misses, or puts elsewhere in the page,
    is counted in ``mismatched_bytes``; address arithmetic proves the same
    per block and byte (``covers_ok``, ``confined_ok``, ``disjoint_ok``).

    vLLM overlays the groups of one spec on the same bytes through the same
    views (Qwen3.5's three Gated-DeltaNet groups): a group whose registered
    and edited views are, view for view, an earlier group's would make the
    very same torch calls on the very same bytes, so it is run once and
    every such group reports what that run found.

    Args:
        kv_cache_config: the vLLM ``KVCacheConfig`` the caches were built for
            (groups, per-layer specs, ``num_blocks``).
        kv_caches: the registered caches (what vLLM hands a connector).
        edited: the edited mapping, e.g. :func:`apply_kv_cache_group_edits`'s
            result; unedited layers may be the registered objects themselves.
        blocks: block ids to exercise; ``None`` for all ``num_blocks``.
        restore: leave the caches' bytes as they were.  The round trip
            then runs, one tile at a time, on a replica of the tile: the
            registered and edited views moved, offset for offset, onto a
            buffer the size of the tile (the same storage offsets relative
            to one another, shapes, strides and dtypes, so the same bytes
            meet), and the caches are never written.  Where no replica can
            stand for a tile (views of one buffer that step by different
            bytes per block), the tile's bytes are saved and put back while
            it is in cache.  ``False`` runs on the caches themselves and
            leaves the patterns there.
        chunk_bytes: how many bytes of one group one step works on (a tile:
            its layers in the window, every block of the chunk), which also
            bounds the separate store buffer; ``None`` picks
            :func:`kvexplore.editing.tiling.default_chunk_bytes` (a
            last-level-cache share on the CPU, 256 MiB on CUDA).  A tile
            holds at least one layer of one block.  Must be a positive int.
        threads: CPU threads for the data check; ``None`` for
            ``torch.get_num_threads()``.  With pages of a mebibyte or more
            (Qwen3.5-0.8B's on the H100) each takes whole tiles, one at a
            time, on one intra-op thread, so a thread that is descheduled on
            a busy machine holds nobody up; with smaller pages, or, on the
            caches themselves (``restore=False``), where two tiles would
            write the same byte (an edited view that leaves its page), the
            tiles run in order, each torch call on ``threads``
            intra-op threads (the caller's for ``None``).  The
            caller's intra-op setting is restored afterwards
            (``benchmarks/bench_edits.py`` measures 1 and the default).

    Returns:
        :class:`RoundTripReport`; a mismatch is reported, not raised.

    Raises:
        KVExploreError: inputs that do not describe one registration (missing
            or extra layers, tensors not in their spec's dtype, mixed devices,
            leading dims that are not whole blocks), an unusable ``blocks``,
            or a ``chunk_bytes`` or ``threads`` that is not a positive int,
            each naming the value.
    """
    if kv_cache_config is None or not hasattr(kv_cache_config, "num_blocks"):
        raise KVExploreError(
            f"kv_cache_config is {type(kv_cache_config).__name__}; expected the "
            "vLLM KVCacheConfig the caches were built for"
        )
    check_chunk_bytes(chunk_bytes)
    check_int("threads", threads, minimum=1, allow_none=True)
    started = time.perf_counter()
    num_blocks = int(kv_cache_config.num_blocks)
    chosen = selection(blocks, num_blocks)
    layers = layers_under_test(kv_cache_config, kv_caches, edited)
    if not layers:
        return RoundTripReport((), 0.0, "cpu")
    device = layers[0].device
    checks = address_checks(layers, chosen, num_blocks)
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(device)
    damage = exercise(
        layers,
        chosen,
        chunk_bytes,
        restore,
        threads=threads,
        confined=all(check.confined_ok for check in checks),
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    verdicts = tuple(
        LayerVerdict.of(
            layer, len(chosen), check, hurt,
            None if hurt.checked_with is None else layers[hurt.checked_with].name,
        )
        for layer, check, hurt in zip(layers, checks, damage, strict=True)
    )
    return RoundTripReport(verdicts, time.perf_counter() - started, str(device))
