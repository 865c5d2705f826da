"""The round-trip engine's schedule: threads sharing tiles, groups starting
from the pattern the group before left, rotations in segments.

Each changes how many bytes move and in which order, never what is found:
every test counts the damage by hand and checks the caches keep their bytes.
"""

from __future__ import annotations

import threading

import pytest
import torch
from edit_layouts import (
    QWEN_PAGE,
    qwen_groups,
    randomize,
    snapshot,
    unified_registration,
)
from torch.utils._python_dispatch import TorchDispatchMode

import kvexplore.editing.tiling as tiling
from kvexplore.editing.proof import layers_under_test
from kvexplore.editing.roundtrip import verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits

#: Qwen3.5's GDN page as the test layouts register it: conv 3 x 6144 bf16
#: (36,864 B) then the SSM state, 1,085,440 B of state in all.
CONV = 3 * 6144 * 2
STATE = 1_085_440
#: ``[:, :500]`` of the GDN page view ``[544, 1, 2000]`` keeps bytes 0 to
#: 1,000,000 of each page: the rest of the state is never stored.
KEPT = 500 * 2000

COLUMNS = ["layer", "ok", "mismatched_bytes", "first_mismatch", "uncovered_bytes", "checked_with"]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def workers(monkeypatch):
    """How many threads each ``together`` call of the engine started (one entry per call)."""
    seen = []
    real = tiling._Run.together

    def spy(self, count, *args, **kwargs):
        seen.append(count)
        return real(self, count, *args, **kwargs)

    monkeypatch.setattr(tiling._Run, "together", spy)
    return seen


def test_two_threads_share_the_tiles_and_find_what_one_thread_finds(workers):
    # Two 1,114,112-byte GDN layers per block fill the 4 MiB tile: six
    # one-block steps, which two threads take between them.
    cfg, caches = unified_registration(qwen_groups(2), 6, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    randomize(caches, seed=5)
    before = snapshot(caches)
    together = verify_roundtrip(cfg, caches, edited, threads=2)
    assert workers == [2]
    alone = verify_roundtrip(cfg, caches, edited, threads=1)
    assert workers == [2]  # one thread runs the steps in order itself
    assert same(before, snapshot(caches))
    rows = together.table.set_index("layer")
    bad = rows.loc["model.layers.1.0"]
    assert bad["mismatched_bytes"] == 6 * (STATE - KEPT) == bad["uncovered_bytes"]
    # the earliest block's first byte, whichever thread found it first
    assert bad["first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index="model.layers.1.0")["ok"].all()
    assert together.table[COLUMNS].equals(alone.table[COLUMNS])


def test_tiles_that_share_bytes_run_in_order(workers):
    # 2,100 bytes per token: each block's edited view reaches 28,288 bytes
    # into the next page, a byte that two steps would write.
    cfg, caches = unified_registration([(["g0", "g1"], qwen_groups(1)[0][1])], 2)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    view = edited["g0"]
    edited["g0"] = view.as_strided((2, 544, 1, 2100), (view.stride(0), 2100, 2100, 1))
    report = verify_roundtrip(cfg, caches, edited, threads=2, restore=False)
    assert workers == []
    rows = report.table.set_index("layer")
    assert not rows.loc["g0", "confined_ok"] and rows.loc["g1", "ok"]
    alone = verify_roundtrip(cfg, caches, edited, threads=1, restore=False)
    assert report.table[COLUMNS].equals(alone.table[COLUMNS])
    # On replicas (``restore``) no step reaches another's bytes: two threads
    # take the steps and find the same.
    replicas = verify_roundtrip(cfg, caches, edited, threads=2)
    assert workers == [2]
    assert replicas.table[COLUMNS].equals(report.table[COLUMNS])


def test_small_pages_run_in_order_with_every_call_split_over_the_threads(workers):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    # 4 KiB pages: a tile is many of them, and the tiles run in order.
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    cfg, caches = unified_registration([(["a0", "a1"], spec)], 40)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    assert verify_roundtrip(cfg, caches, edited, threads=2).ok
    assert workers == []
    # the edited view [40, 1, 16 tokens, 128] (K and V of a token side by
    # side) cut to 8 tokens loses the other 8 of every page: 2,048 bytes each
    edited["a1"] = edited["a1"][:, :, :8]
    rows = verify_roundtrip(cfg, caches, edited, threads=2).table.set_index("layer")
    assert workers == []
    assert rows.loc["a1", "mismatched_bytes"] == 40 * 8 * 128 * 2
    assert rows.loc["a0", "ok"] and not rows.loc["a1", "ok"]


def test_an_error_in_another_thread_is_raised_and_every_byte_is_put_back(monkeypatch):
    cfg, caches = unified_registration(qwen_groups(2), 6, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    randomize(caches, seed=7)
    before = snapshot(caches)
    real = tiling._run_tile
    failed = threading.Event()

    def run_tile(tile, *args):
        if threading.current_thread() is not threading.main_thread():
            failed.set()
            raise RuntimeError("the helper's tile broke")
        assert failed.wait(timeout=60), "the helper never took a step"
        return real(tile, *args)

    monkeypatch.setattr(tiling, "_run_tile", run_tile)
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="the helper's tile broke"):
        verify_roundtrip(cfg, caches, edited, threads=2)
    assert torch.get_num_threads() == 2
    assert same(before, snapshot(caches))


def test_the_gdn_group_starts_from_the_pattern_the_attention_group_left(monkeypatch):
    # One tile of five blocks.  The attention page holds each GDN layer's
    # state at the same place, so the attention group fills and the GDN
    # group (run once for the three that repeat one another) only moves
    # and compares.
    cfg, caches = unified_registration(qwen_groups(2), 5, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    filled = []
    real = tiling._put

    def put(stack, *args):
        filled.append(stack.layers[0].layer.name)
        return real(stack, *args)

    monkeypatch.setattr(tiling, "_put", put)
    assert verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).ok
    assert filled == ["model.layers.3.0"]
    # Starting from that pattern, the GDN group's misses are still lost:
    # five pages of each of its layers, counted by hand.
    names = [f"model.layers.{g}.{i}" for g in range(3) for i in range(2)]
    for name in names:
        edited[name] = edited[name][:, :500]
    filled.clear()
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).table
    rows = rows.set_index("layer")
    assert filled == ["model.layers.3.0"]
    for name in names:
        assert rows.loc[name, "mismatched_bytes"] == 5 * (STATE - KEPT)
        assert rows.loc[name, "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index=names)["ok"].all()


def test_a_fill_is_held_only_by_a_dense_fill_with_the_same_steps_and_phase():
    raw = torch.zeros(4096, dtype=torch.uint8)
    page = raw.as_strided((1, 4, 512), (2048, 512, 1))  # 4 dense 512-byte pages
    held = tiling._Extent.of(page, tag=0)
    inside = raw.as_strided((1, 4, 100), (2048, 512, 1), 40)
    assert held.dense and held.holds(tiling._Extent.of(inside, tag=40))
    # the same bytes with another pattern phase, past the page, or at
    # another block step are not held
    past = raw.as_strided((1, 4, 100), (2048, 512, 1), 420)
    wider = raw.as_strided((1, 4, 100), (2048, 1024, 1), 40)
    assert not held.holds(tiling._Extent.of(inside, tag=41))
    assert not held.holds(tiling._Extent.of(past, tag=420))
    assert not held.holds(tiling._Extent.of(wider, tag=40))
    # every other byte of a page holds nothing
    sparse = tiling._Extent.of(raw.as_strided((1, 4, 256), (2048, 512, 2)), tag=0)
    assert not sparse.dense and not sparse.holds(tiling._Extent.of(inside, tag=40))


@pytest.mark.parametrize(
    ("m", "unit", "h"),
    [
        (3, 1_179_648, 1),
        (6, 1_114_112, 1),
        (64, 65_536, 16),
        (5, 1, 3),
        (2, 1, 1),
        (40, 300_000, 4),
    ],
)
def test_a_rotating_load_moves_each_unit_the_fewest_places_that_make_a_mebibyte(m, unit, h):
    assert tiling.shift(m, unit) == h
    assert 0 < h < m


def test_a_rotation_in_one_block_segments_loses_the_missed_bytes_of_every_page(monkeypatch):
    # One layer per group, six blocks in one tile: each 1,114,112-byte block
    # is a mebibyte segment, so the load moves every block one place on, in
    # four one-block copies between the store and the load.
    cfg, caches = unified_registration(qwen_groups(1), 6, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    shifts = []
    real = tiling.shift

    def spy(m, unit):
        shifts.append((m, real(m, unit)))
        return shifts[-1][1]

    monkeypatch.setattr(tiling, "shift", spy)
    randomize(caches, seed=11)
    before = snapshot(caches)
    assert verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).ok
    assert set(shifts) == {(6, 1)}
    edited["model.layers.0.0"] = edited["model.layers.0.0"][:, :500]
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).table
    rows = rows.set_index("layer")
    assert rows.loc["model.layers.0.0", "mismatched_bytes"] == 6 * (STATE - KEPT)
    assert rows.loc["model.layers.0.0", "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index="model.layers.0.0")["ok"].all()
    assert same(before, snapshot(caches))


class Writes(TorchDispatchMode):
    """The storages every torch op run on this thread wrote to."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for index, arg in enumerate(func._schema.arguments):
            value = args[index] if index < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and isinstance(value, torch.Tensor):
                self.storages.add(value.untyped_storage().data_ptr())
        return func(*args, **kwargs)


def cache_storages(caches) -> set[int]:
    return {
        t.untyped_storage().data_ptr()
        for v in caches.values()
        for t in ([v] if isinstance(v, torch.Tensor) else v)
    }


def test_restore_runs_on_a_replica_and_never_writes_the_cache():
    # Two GDN layers per window, 6.7 MB apart on one buffer: the replica
    # holds each layer's span of the tile, side by side.
    cfg, caches = unified_registration(qwen_groups(2), 6, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    randomize(caches, seed=13)
    before = snapshot(caches)
    with Writes() as replica:
        restored = verify_roundtrip(cfg, caches, edited, threads=1)
    assert replica.storages and not replica.storages & cache_storages(caches)
    assert same(before, snapshot(caches))
    # ``restore=False`` runs on the cache itself (the recorder sees it) and
    # finds the same, counted by hand: the last 85,440 state bytes of six pages.
    with Writes() as live:
        left = verify_roundtrip(cfg, caches, edited, threads=1, restore=False)
    assert live.storages & cache_storages(caches)
    assert restored.table[COLUMNS].equals(left.table[COLUMNS])
    bad = restored.table.set_index("layer").loc["model.layers.1.0"]
    assert bad["mismatched_bytes"] == 6 * (STATE - KEPT)
    assert bad["first_mismatch"] == (0, "ssm", KEPT - CONV)


def test_a_replica_lays_each_layer_span_of_a_window_side_by_side():
    cfg, caches = unified_registration(qwen_groups(2), 6, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    layers = layers_under_test(cfg, caches, edited)
    tiled = [tiling.TiledLayer.of(i, layer) for i, layer in enumerate(layers)]
    # A tile of one block and both layers (0 and 1) of every group: the four
    # groups overlay each layer's page, so a layer is one span of one page.
    replica = tiling._Replica.of([tiled], 1, torch.device("cpu"))
    (slot,) = replica.slots[0]
    page = QWEN_PAGE
    assert [hi - lo for lo, hi in slot.spans] == [page, page]
    assert slot.spans[1][0] - slot.spans[0][0] == 6 * page  # layer_stride in the cache
    assert slot.width == page and replica.sizes == (2 * page,)
    # the moved views keep their offsets within a span, and the second span
    # starts one width further on
    moved = replica.layers(0, tiled, replica.buffers())
    second = [layer for layer in moved if layer.name == "model.layers.0.1"][0]
    assert second.regions[0].view.storage_offset() == page
    # Views of one storage that step by different bytes per block run on
    # the cache: the replica of one chunk would not stand for another.
    skewed = tiled[0].layer
    part = skewed.edited_parts[0]
    odd = part.as_strided(part.shape, (part.stride(0) + 64, *part.stride()[1:]))
    bent = tiling.TiledLayer.of(0, tiling.replace(skewed, edited_parts=(odd,)))
    assert tiling._Replica.of([[bent]], 1, torch.device("cpu")) is None


def test_views_the_replica_cannot_hold_run_on_the_cache_and_put_every_byte_back():
    cfg, caches = unified_registration(qwen_groups(1), 4, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    view = edited["model.layers.0.0"]
    # each block's edited view starts 64 bytes later in its page than the
    # one before: the last 64 x b bytes of block b's state are never stored
    # and 64 x b bytes of padding come back in front
    edited["model.layers.0.0"] = view.as_strided(
        view.shape, (view.stride(0) + 64, *view.stride()[1:])
    )
    randomize(caches, seed=17)
    before = snapshot(caches)
    with Writes() as live:
        report = verify_roundtrip(cfg, caches, edited, threads=1)
    assert live.storages & cache_storages(caches)
    assert same(before, snapshot(caches))
    row = report.table.set_index("layer").loc["model.layers.0.0"]
    assert not row["ok"] and not row["covers_ok"]
    assert row["uncovered_bytes"] == 64 * (0 + 1 + 2 + 3)
