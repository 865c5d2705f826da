"""verify_roundtrip: byte-exact store/load through edited views, and its proofs.

Qwen3.5's GDN page as the test layouts register it: conv 3 x 6144 bf16
(36,864 B) then the SSM state, 1,085,440 B of state in a 1,114,112-byte
page; the unified edit views it as ``[blocks, 544, 1, 2000]``, and
``[:, :500]`` of that view keeps bytes 0 to 1,000,000 of each page: the
last 85,440 state bytes are never stored.
"""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
import torch
from edit_layouts import (
    QWEN_PAGE,
    config,
    legacy_mamba,
    legacy_registration,
    qwen_attn,
    qwen_gdn,
    qwen_groups,
    randomize,
    same,
    snapshot,
    storage_bytes,
    unified_registration,
)
from torch.utils._python_dispatch import TorchDispatchMode
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from kvexplore.editing.roundtrip import RoundTripReport, verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONV = 3 * 6144 * 2
STATE = 1_085_440
KEPT = 500 * 2000


def qwen_unified(layers_per_group, num_blocks):
    cfg, caches = unified_registration(
        qwen_groups(layers_per_group), num_blocks, kernel=32
    )
    return cfg, caches, dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))


# --------------------------------------------------------------------------
# Good views: every byte comes back, the caches keep theirs
# --------------------------------------------------------------------------


def test_qwen_unified_every_byte_comes_back():
    cfg, caches, edited = qwen_unified(2, 6)
    randomize(caches)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited)
    assert isinstance(report, RoundTripReport) and report.ok
    table = report.table
    assert len(table) == 8 and table["edited"].all()
    assert set(table["regions"]) == {"conv,ssm", "K,V"}
    gdn = table.set_index("layer").loc["model.layers.0.0"]
    assert gdn["bytes"] == 6 * STATE and gdn["uncovered_bytes"] == 0
    assert gdn["detail"] == "every byte came back"
    assert report.by_group()["ok"].tolist() == [True] * 4
    assert same(before, snapshot(caches))


def test_qwen_legacy_every_byte_comes_back_and_restore_false_leaves_pattern():
    cfg, caches = legacy_registration(qwen_groups(1), 3, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited, restore=False)
    assert report.ok, report
    assert report.table["regions"].tolist() == ["conv,ssm"] * 3 + ["K,V"]
    attn = caches["model.layers.3.0"]
    assert bool((attn.view(torch.uint8) != 0).all())  # pattern never contains 0
    k0, v0 = attn[0, 0].view(torch.uint8), attn[0, 1].view(torch.uint8)
    assert not torch.equal(k0, v0)  # K and V regions are distinguishable


def test_unified_k_and_v_get_different_patterns():
    cfg, caches = unified_registration([(["k"], qwen_attn())], 2, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    assert verify_roundtrip(cfg, caches, edited, restore=False).ok
    page = storage_bytes(caches)[0][:QWEN_PAGE]
    row = page[: 2 * 256 * 2].reshape(2, 256 * 2)  # first token row: K | V
    assert bool((page != 0).all()) and not torch.equal(row[0], row[1])


def test_block_subset_touches_only_those_blocks():
    cfg, caches = legacy_registration(qwen_groups(1), 5, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited, blocks=[4, 1, 2], restore=False)
    assert report.ok and report.table["blocks"].tolist() == [3] * 4
    conv = caches["model.layers.0.0"][0]
    assert bool((conv[0] == 0).all()) and bool((conv[3] == 0).all())
    for block in (1, 2, 4):
        assert bool((conv[block].view(torch.uint8) != 0).all())


def test_many_small_chunks_restore_every_byte_and_match_one_chunk():
    cfg, caches, edited = qwen_unified(2, 5)
    randomize(caches, seed=3)
    before = snapshot(caches)
    small = verify_roundtrip(cfg, caches, edited, chunk_bytes=1)  # one block a step
    assert small.ok, small
    assert same(before, snapshot(caches))
    big = verify_roundtrip(
        cfg, caches, edited, blocks=[4, 0, 1, 2], chunk_bytes=1 << 40
    )
    assert big.ok and big.table["blocks"].tolist() == [4] * 8
    assert same(before, snapshot(caches))
    columns = ["layer", "regions", "roundtrip_ok", "covers_ok", "confined_ok"]
    assert small.table[columns].equals(big.table[columns])


def test_the_load_puts_each_block_into_the_next_block_of_its_chunk():
    cfg, caches = unified_registration([(["a", "b", "c"], qwen_gdn())], 3)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    (flat,) = storage_bytes(caches)  # one allocation, layer-compact: a | b | c
    pages = flat.reshape(3, 3, QWEN_PAGE)  # [layer, block, page]

    # One block a chunk: every block is loaded back into itself, and byte
    # pos of the page of layer l, block b, region k (conv 0, ssm 1) holds
    # 1 + (pos + 37 l + 97 b + 53 k) % 251.
    assert verify_roundtrip(cfg, caches, edited, restore=False, chunk_bytes=1).ok
    own = pages[:, :, :STATE].clone()
    pos = torch.arange(STATE)
    region = (pos >= CONV).long()
    for layer in range(3):
        for block in range(3):
            want = 1 + (pos + 37 * layer + 97 * block + 53 * region) % 251
            assert torch.equal(own[layer, block], want.to(torch.uint8)), (layer, block)
    assert bool((own != 0).all())  # every state byte filled
    assert bool((pages[:, :, STATE:] == 0).all())  # padding never written
    states = {
        bytes(own[layer, block].numpy()) for layer in range(3) for block in range(3)
    }
    assert len(states) == 9  # a pattern of its own per layer and block
    conv = own[0, 0, :CONV]
    assert not torch.equal(conv[:64], own[0, 0, CONV : CONV + 64])  # conv != ssm

    # One chunk of three blocks: block i's bytes land in block i + 1 (mod 3).
    assert verify_roundtrip(cfg, caches, edited, restore=False, chunk_bytes=1 << 30).ok
    for block in range(3):
        assert torch.equal(pages[:, block, :STATE], own[:, (block - 1) % 3])
    assert bool((pages[:, :, STATE:] == 0).all())


def test_a_gap_between_regions_is_never_written():
    # Conv (15 int8 bytes) and SSM (32 bytes, float32 from byte 24) in a
    # 64-byte page: bytes 15-23 and 56-63 belong to no region.
    spec = MambaSpec(
        block_size=16,
        shapes=((3, 5), (2, 4)),
        dtypes=(torch.int8, torch.float32),
        page_size_padded=64,
        mamba_cache_mode="align",
    )
    cfg = config([(["m", "n"], spec)], 4)
    caches, raws = {}, []
    for name in "mn":
        raw = torch.zeros(4 * 64, dtype=torch.uint8)
        conv = raw.view(torch.int8).as_strided((4, 3, 5), (64, 5, 1), 0)
        ssm = raw.view(torch.float32).as_strided((4, 2, 4), (16, 4, 1), 6)
        caches[name] = [conv, ssm]
        raws.append(raw.view(4, 64))
    report = verify_roundtrip(cfg, caches, caches, restore=False)
    assert report.ok, report
    assert report.table["regions"].tolist() == ["conv,ssm"] * 2
    assert not report.table["edited"].any()
    for page in raws:
        assert bool((page[:, :15] != 0).all()) and bool((page[:, 24:56] != 0).all())
        assert bool((page[:, 15:24] == 0).all()) and bool((page[:, 56:] == 0).all())


def test_small_pages_many_blocks_a_chunk_count_the_missing_tokens():
    # 4 KiB pages: one chunk holds all 40 blocks.  The edited view
    # [40, 1, 16 tokens, 128] (K and V of a token side by side) cut to 8
    # tokens never stores the other 8 of each page: 8 x 128 x 2 B a page.
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
    )
    cfg, caches = unified_registration([(["a0", "a1"], spec)], 40)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    assert verify_roundtrip(cfg, caches, edited).ok
    edited["a1"] = edited["a1"][:, :, :8]
    rows = verify_roundtrip(cfg, caches, edited).table.set_index("layer")
    assert rows.loc["a1", "mismatched_bytes"] == 40 * 8 * 128 * 2
    assert rows.loc["a1", "uncovered_bytes"] == 40 * 8 * 128 * 2
    assert rows.loc["a0", "ok"] and not rows.loc["a1", "ok"]


def test_untouched_non_mamba_registration_round_trips():
    cfg, caches = legacy_registration([(["a", "b"], qwen_attn())], 2)
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited)
    assert report.ok and not report.table["edited"].any()


# --------------------------------------------------------------------------
# Planted faults: which layer, which block, which byte
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunk_bytes", [None, 1, 1 << 30], ids=["default", "one-block", "one-chunk"]
)
def test_bytes_the_edited_view_misses_are_lost_in_the_data_too(chunk_bytes):
    cfg, caches, edited = qwen_unified(2, 3)
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    randomize(caches, seed=3)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
    rows = report.table.set_index("layer")
    bad = rows.loc["model.layers.1.0"]
    assert bad["mismatched_bytes"] == 3 * (STATE - KEPT) == bad["uncovered_bytes"]
    assert bad["first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert "first at block 0, ssm byte 963136" in bad["detail"]
    assert rows.drop(index="model.layers.1.0")["ok"].all()
    assert same(before, snapshot(caches))
    # restore=False finds the same, byte for byte.
    left = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes, restore=False)
    assert left.table.equals(report.table)


def test_every_gdn_layer_of_overlaid_groups_reports_its_own_loss():
    # The three GDN groups overlay one allocation through the same views;
    # each is run on its own and each of its layers reports five pages.
    cfg, caches, edited = qwen_unified(2, 5)
    names = [f"model.layers.{g}.{i}" for g in range(3) for i in range(2)]
    for name in names:
        edited[name] = edited[name][:, :500]
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).table.set_index(
        "layer"
    )
    for name in names:
        assert rows.loc[name, "mismatched_bytes"] == 5 * (STATE - KEPT)
        assert rows.loc[name, "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index=names)["ok"].all()


@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["both-blocks", "one-block"])
def test_every_layer_of_a_group_loses_its_missed_bytes(chunk_bytes):
    cfg, caches, edited = qwen_unified(3, 2)
    names = [f"model.layers.1.{i}" for i in range(3)]
    for name in names:
        edited[name] = edited[name][:, :500]
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes).table
    rows = rows.set_index("layer")
    for name in names:
        assert rows.loc[name, "mismatched_bytes"] == 2 * (STATE - KEPT)
        assert rows.loc[name, "uncovered_bytes"] == 2 * (STATE - KEPT)
        assert rows.loc[name, "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index=names)["ok"].all()


def test_chunks_of_three_blocks_lose_the_missed_bytes_of_every_page():
    cfg, caches, edited = qwen_unified(6, 5)
    # Six layers of 1,085,440 registered bytes a block: 6,512,640 B a block,
    # so this chunk_bytes makes the chunks blocks 0-2 and 3-4.
    three_blocks = 3 * 6 * STATE
    edited["model.layers.1.4"] = edited["model.layers.1.4"][:, :500]
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=three_blocks)
    rows = report.table.set_index("layer")
    assert rows.loc["model.layers.1.4", "mismatched_bytes"] == 5 * (STATE - KEPT)
    assert rows.loc["model.layers.1.4", "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index="model.layers.1.4")["ok"].all()
    assert verify_roundtrip(cfg, caches, edited, chunk_bytes=1).table.equals(
        report.table
    )


def test_uncovered_bytes_are_counted_exactly_per_block():
    cfg, caches = unified_registration([(["g"], qwen_gdn())], 3)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    view = edited["g"]
    rows = view.shape[1] // 2  # only the first half of each page's token rows
    edited["g"] = view.as_strided((3, rows, *view.shape[2:]), view.stride())
    report = verify_roundtrip(cfg, caches, edited)
    row = report.table.iloc[0]
    covered = rows * view.shape[-1] * view.element_size()  # 272 x 2000 = 544,000
    assert not report.ok and not row["covers_ok"] and row["confined_ok"]
    assert row["uncovered_bytes"] == 3 * (STATE - covered) == row["mismatched_bytes"]
    assert row["first_mismatch"] == (0, "ssm", covered - CONV)
    assert "misses registered bytes of blocks [0, 1, 2]" in row["detail"]


def test_overlapping_views_are_caught_by_data_and_address():
    # Two layers registered on the same bytes.  b's fill overwrites a's
    # pattern, so a's every state byte comes back with b's pattern:
    # 2 blocks x 1,085,440 B wrong for a.  b's bytes are b's own pattern,
    # moved as b's view moved them: its data is right (0 wrong), and only
    # the address check (disjoint_ok) fails it.
    spec = qwen_gdn()
    states = legacy_mamba(spec, 2)
    cfg = config([(["a", "b"], spec)], 2)
    caches = {"a": states, "b": list(states)}
    edited = apply_kv_cache_group_edits(cfg, caches)
    for chunk_bytes in (None, 1):
        report = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
        rows = report.table.set_index("layer")
        assert not rows.loc["a", "disjoint_ok"] and not rows.loc["b", "disjoint_ok"]
        assert "overlaps 'b'" in rows.loc["a", "detail"]
        assert rows.loc["a", "mismatched_bytes"] == 2 * STATE
        assert rows.loc["a", "first_mismatch"] == (0, "conv", 0)
        assert rows.loc["b", "mismatched_bytes"] == 0 and rows.loc["b", "roundtrip_ok"]
        assert not rows.loc["a", "ok"] and not rows.loc["b", "ok"] and not report.ok


def test_a_skewed_block_stride_is_caught_and_every_byte_is_put_back():
    cfg, caches, edited = qwen_unified(1, 4)
    view = edited["model.layers.0.0"]
    # each block's edited view starts 64 bytes later in its page than the
    # one before: block b misses its first 64 x b registered bytes
    edited["model.layers.0.0"] = view.as_strided(
        view.shape, (view.stride(0) + 64, *view.stride()[1:])
    )
    row = (
        verify_roundtrip(cfg, caches, edited)
        .table.set_index("layer")
        .loc["model.layers.0.0"]
    )
    assert not row["ok"] and not row["covers_ok"]
    assert row["uncovered_bytes"] == 64 * (0 + 1 + 2 + 3)
    # Block b's bytes land 64 B (block 0: 3 x 64 B the other way) off their
    # place in the next block, where the pattern differs (64 and 192 are not
    # multiples of 251), or stay zero: every registered byte is wrong.
    assert row["mismatched_bytes"] == 4 * STATE
    assert row["first_mismatch"] == (0, "conv", 0)
    randomize(caches, seed=17)
    before = snapshot(caches)
    assert not verify_roundtrip(cfg, caches, edited).ok
    assert same(before, snapshot(caches))


def test_a_view_of_the_neighbour_block_is_caught_and_its_bytes_put_back():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 3)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    page_view = edited["g"]
    shifted = page_view.as_strided(
        (2, *page_view.shape[1:]), page_view.stride(), page_view.stride(0)
    )
    cfg2 = config([(["g"], qwen_gdn())], 2)
    caches2 = {"g": [t[:2] for t in caches["g"]]}
    randomize(caches)  # page 2 too, which only the shifted view reaches
    before = snapshot(caches)
    report = verify_roundtrip(cfg2, caches2, {"g": shifted})
    row = report.table.iloc[0]
    assert not report.ok and not row["confined_ok"] and not row["covers_ok"]
    assert "leaves its page in blocks [0, 1]" in row["detail"]
    assert not row["roundtrip_ok"]
    assert same(before, snapshot(caches))


def test_a_view_with_another_block_step_is_caught_in_the_blocks_it_misses():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 4)
    page_view = apply_kv_cache_group_edits(cfg, caches)["g"]
    skipping = page_view.as_strided(
        (2, *page_view.shape[1:]),
        (2 * page_view.stride(0), *page_view.stride()[1:]),
        page_view.storage_offset(),
    )  # block 1 -> page 2
    cfg2 = config([(["g"], qwen_gdn())], 2)
    caches2 = {"g": [t[:2] for t in caches["g"]]}
    report = verify_roundtrip(cfg2, caches2, {"g": skipping})
    row = report.table.iloc[0]
    assert not row["covers_ok"] and not row["confined_ok"] and not report.ok
    assert "misses registered bytes of blocks [1]" in row["detail"]
    assert "leaves its page in blocks [1]" in row["detail"]
    # Block 0's bytes went to page 2, and page 1 is never loaded: it stays zero.
    assert row["mismatched_bytes"] >= STATE


def test_a_view_that_spills_into_a_sibling_page_is_caught():
    cfg, caches = unified_registration([(["g0", "g1"], qwen_gdn())], 2)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    view = edited["g0"]
    # 2,100 bytes per token: 544 x 2100 = 1,142,400 > the 1,114,112-byte page
    edited["g0"] = view.as_strided((2, 544, 1, 2100), (view.stride(0), 2100, 2100, 1))
    report = verify_roundtrip(cfg, caches, edited)
    rows = report.table.set_index("layer")
    assert not rows.loc["g0", "confined_ok"] and rows.loc["g0", "covers_ok"]
    assert rows.loc["g1", "ok"]


def test_a_copy_is_caught():
    cfg, caches = legacy_registration(qwen_groups(1), 2, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    edited["model.layers.3.0"] = edited["model.layers.3.0"].clone()
    report = verify_roundtrip(cfg, caches, edited)
    assert not report.ok
    row = report.table.set_index("layer").loc["model.layers.3.0"]
    assert not row["covers_ok"] and not row["confined_ok"]
    assert row["uncovered_bytes"] == 2 * QWEN_PAGE
    # the load went to the copy: the zeroed page never got its bytes back
    assert row["mismatched_bytes"] == 2 * QWEN_PAGE
    assert row["first_mismatch"] == (0, "K", 0)
    assert "other storage" in row["detail"]
    assert report.failures()["layer"].tolist() == ["model.layers.3.0"]


def test_token_rows_that_alias_are_reported_layer_by_layer():
    cfg, caches = unified_registration([(["a", "b", "c"], qwen_gdn())], 2)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    for name, view in edited.items():  # every token row aliases row 0
        strides = (view.stride(0), 0, *view.stride()[2:])  # [blocks, 544, 1, 2000]
        edited[name] = view.as_strided(view.shape, strides, view.storage_offset())
    randomize(caches, seed=5)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited)
    rows = report.table.set_index("layer")
    for name in "abc":
        assert "cannot be stored/loaded" in rows.loc[name, "detail"], name
        assert not rows.loc[name, "covers_ok"] and not rows.loc[name, "ok"]
        assert rows.loc[name, "mismatched_bytes"] == 2 * STATE  # nothing was loaded
    assert same(before, snapshot(caches))


def test_layers_that_repeat_a_layout_further_on_keep_their_own_pages():
    # Three layers with one layout, 0, 1 and 2 pages into one buffer: the
    # second layer's block 0 is the first layer's block 1, the third layer
    # clears both.
    spec = qwen_gdn()
    raw = torch.zeros(4 * QWEN_PAGE, dtype=torch.int8)
    caches = {
        name: legacy_mamba(spec, 2, raw=raw, base_pages=pages)
        for name, pages in (("a", 0), ("b", 1), ("c", 2))
    }
    cfg = config([(["a", "b", "c"], spec)], 2)
    rows = verify_roundtrip(cfg, caches, caches).table.set_index("layer")
    assert not rows.loc["a", "disjoint_ok"] and not rows.loc["b", "disjoint_ok"]
    assert "page of block 1 overlaps 'b'" in rows.loc["a", "detail"]
    assert "page of block 0 overlaps 'a'" in rows.loc["b", "detail"]
    assert "block 0 overlaps" not in rows.loc["a", "detail"]
    assert rows.loc["c", "covers_ok"] and rows.loc["c", "confined_ok"]
    assert "overlaps 'a'" not in rows.loc["c", "detail"]


# --------------------------------------------------------------------------
# Restore on an exception, the report, bad inputs, the GPU
# --------------------------------------------------------------------------


class Boom(Exception):
    pass


class FailOnSecondWrite(TorchDispatchMode):
    """Raises ``Boom`` the second time a torch op writes into ``storages``."""

    def __init__(self, storages) -> None:
        super().__init__()
        self.storages, self.writes = storages, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for index, arg in enumerate(func._schema.arguments):
            value = args[index] if index < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and isinstance(value, torch.Tensor):
                if value.untyped_storage().data_ptr() in self.storages:
                    self.writes += 1
                    if self.writes == 2:
                        raise Boom("a step broke mid-chunk")
        return func(*args, **kwargs)


def test_an_exception_mid_chunk_puts_every_byte_back():
    cfg, caches, edited = qwen_unified(2, 3)
    randomize(caches, seed=7)
    before = snapshot(caches)
    storages = {raw.data_ptr() for raw in storage_bytes(caches)}
    with FailOnSecondWrite(storages) as mode, pytest.raises(Boom):
        verify_roundtrip(cfg, caches, edited)
    assert mode.writes > 2  # the fill wrote, then the saved bytes went back
    assert same(before, snapshot(caches))


def test_report_renders():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    report = verify_roundtrip(cfg, caches, apply_kv_cache_group_edits(cfg, caches))
    text = repr(report)
    assert text.startswith("RoundTripReport(OK: 1 layers, 1085440 bytes on cpu)")
    assert "every byte came back" in text
    assert "<table" in report._repr_html_()


def test_report_is_frozen_and_renders_per_group():
    from dataclasses import FrozenInstanceError

    cfg, caches = legacy_registration(qwen_groups(1), 2, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    edited["model.layers.3.0"] = edited["model.layers.3.0"].clone()  # a copy
    report = verify_roundtrip(cfg, caches, edited)
    with pytest.raises(FrozenInstanceError):
        report.device = "cuda"
    with pytest.raises(FrozenInstanceError):
        report.table = None
    handed_out = report.table
    handed_out.loc[0, "ok"] = False  # a copy: the report is unchanged
    assert report.table.loc[0, "ok"]
    assert not report.ok and report.failures()["layer"].tolist() == ["model.layers.3.0"]
    assert report.text() == repr(report)
    assert report.text().startswith("RoundTripReport(FAILED on 1 layer(s): 4 layers")
    assert "<table" in report._repr_html_()
    fig = report.figure()
    checked, failures = fig.axes[:2]
    assert [t.get_text() for t in checked.get_yticklabels()] == [
        "group 0",
        "group 1",
        "group 2",
        "group 3",
    ]
    labels = {t.get_text().strip() for t in failures.texts}
    assert f"{2 * QWEN_PAGE:,}" in labels  # group 3's uncovered bytes


def test_the_signature_and_the_table_columns():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    edited = apply_kv_cache_group_edits(cfg, caches)
    assert list(inspect.signature(verify_roundtrip).parameters) == [
        "kv_cache_config",
        "kv_caches",
        "edited",
        "blocks",
        "restore",
        "chunk_bytes",
    ]
    report = verify_roundtrip(cfg, caches, edited)
    columns = [
        "group", "layer", "edited", "regions", "blocks", "bytes",
        "roundtrip_ok", "mismatched_bytes", "first_mismatch",
        "covers_ok", "uncovered_bytes", "confined_ok", "disjoint_ok", "ok", "detail",
    ]  # fmt: skip
    assert report.table.columns.tolist() == columns
    assert [f.name for f in fields(report.layers[0])] == [
        c for c in columns if c != "ok"
    ]


def test_bad_inputs_are_value_errors():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 2)
    edited = apply_kv_cache_group_edits(cfg, caches)
    with pytest.raises(
        ValueError,
        match=r"blocks=\[0, 2\] holds \[2\]; expected distinct block ids in \[0, 2\)",
    ):
        verify_roundtrip(cfg, caches, edited, blocks=[0, 2])
    with pytest.raises(ValueError, match="duplicates"):
        verify_roundtrip(cfg, caches, edited, blocks=[1, 1])
    with pytest.raises(ValueError, match="expected exactly the layers of kv_caches"):
        verify_roundtrip(cfg, caches, {})
    with pytest.raises(ValueError, match="expected the vLLM KVCacheConfig"):
        verify_roundtrip(None, caches, edited)
    meta = {"g": torch.empty(edited["g"].shape, device="meta")}
    with pytest.raises(ValueError, match="is on meta, the registered cache on cpu"):
        verify_roundtrip(cfg, caches, meta)
    wrong = config([(["g"], qwen_gdn())], 3)
    with pytest.raises(ValueError, match=r"expected 3 blocks x .* as the config's num_blocks says"):
        verify_roundtrip(wrong, caches, edited)
    on_meta = {"g": [torch.empty_like(t, device="meta") for t in caches["g"]]}
    with pytest.raises(ValueError, match=r"'g' is registered on the meta device, which holds no bytes"):
        verify_roundtrip(cfg, on_meta, on_meta)
    with pytest.raises(ValueError, match=r"chunk_bytes=0 is invalid"):
        verify_roundtrip(cfg, caches, edited, chunk_bytes=0)


@pytest.mark.gpu
@gpu
def test_qwen_round_trip_on_gpu():
    for builder in (unified_registration, legacy_registration):
        cfg, caches = builder(qwen_groups(2), 8, kernel=32, device="cuda")
        edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
        assert all(
            v.device.type == "cuda"
            for v in edited.values()
            for v in ([v] if isinstance(v, torch.Tensor) else v)
        )
        randomize(caches)
        before = snapshot(caches)
        report = verify_roundtrip(cfg, caches, edited)
        assert report.ok, report
        assert report.device.startswith("cuda")
        assert same(before, snapshot(caches))
    cfg, caches = unified_registration(qwen_groups(2), 3, kernel=32, device="cuda")
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    rows = verify_roundtrip(cfg, caches, edited).table.set_index("layer")
    assert rows.loc["model.layers.1.0", "mismatched_bytes"] == 3 * (STATE - KEPT)
    assert rows.loc["model.layers.1.0", "first_mismatch"] == (0, "ssm", KEPT - CONV)
    assert rows.drop(index="model.layers.1.0")["ok"].all()
