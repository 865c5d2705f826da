"""verify_roundtrip: byte-exact store/load through edited views, and its proofs."""

from __future__ import annotations

import pandas as pd
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
    snapshot,
    storage_bytes,
    unified_registration,
)

from kvexplore.editing.roundtrip import RoundTripReport, verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_qwen_unified_every_byte_comes_back():
    cfg, caches = unified_registration(qwen_groups(2), 6, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    randomize(caches)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited)
    assert isinstance(report, RoundTripReport) and report.ok
    table = report.table
    assert len(table) == 8 and table["edited"].all()
    assert set(table["regions"]) == {"conv,ssm", "K,V"}
    gdn = table.set_index("layer").loc["model.layers.0.0"]
    assert gdn["bytes"] == 6 * 1085440 and gdn["uncovered_bytes"] == 0
    assert report.by_group()["ok"].tolist() == [True] * 4
    after = snapshot(caches)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


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


def test_block_subset_touches_only_those_blocks():
    cfg, caches = legacy_registration(qwen_groups(1), 5, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited, blocks=[4, 1, 2], restore=False)
    assert report.ok and report.table["blocks"].tolist() == [3] * 4
    conv = caches["model.layers.0.0"][0]
    assert bool((conv[0] == 0).all()) and bool((conv[3] == 0).all())
    assert bool((conv[1].view(torch.uint8) != 0).all())


def test_a_copy_is_caught():
    cfg, caches = legacy_registration(qwen_groups(1), 2, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    edited["model.layers.3.0"] = edited["model.layers.3.0"].clone()
    report = verify_roundtrip(cfg, caches, edited)
    assert not report.ok
    row = report.table.set_index("layer").loc["model.layers.3.0"]
    assert not row["covers_ok"] and not row["confined_ok"]
    assert row["uncovered_bytes"] == 2 * QWEN_PAGE
    assert "other storage" in row["detail"]
    assert report.failures()["layer"].tolist() == ["model.layers.3.0"]


def test_a_view_of_the_neighbour_block_is_caught():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 3)
    edited = dict(apply_kv_cache_group_edits(cfg, caches))
    page_view = edited["g"]
    shifted = page_view.as_strided(
        (2, *page_view.shape[1:]), page_view.stride(), page_view.stride(0)
    )
    cfg2 = config([(["g"], qwen_gdn())], 2)
    caches2 = {"g": [t[:2] for t in caches["g"]]}
    report = verify_roundtrip(cfg2, caches2, {"g": shifted})
    row = report.table.iloc[0]
    assert not report.ok and not row["confined_ok"] and not row["covers_ok"]
    assert "leaves its page in blocks [0, 1]" in row["detail"]


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


def test_overlapping_sibling_pages_are_reported_with_mismatches():
    spec = qwen_gdn()
    states = legacy_mamba(spec, 2)
    cfg = config([(["a", "b"], spec)], 2)
    caches = {"a": states, "b": list(states)}  # two layers on the same bytes
    edited = apply_kv_cache_group_edits(cfg, caches)
    # Default tiles hold one layer of this 1 MiB page each: the overlap is
    # caught by address arithmetic alone.
    tiled = verify_roundtrip(cfg, caches, edited).table.set_index("layer")
    assert not tiled.loc["a", "disjoint_ok"] and not tiled.loc["a", "ok"]
    assert "overlaps 'b'" in tiled.loc["a", "detail"]
    # One tile for the whole group: b's fill also overwrites a's pattern
    # before a is compared, and the mismatch is located to the byte.
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30)
    rows = report.table.set_index("layer")
    assert not rows.loc["a", "disjoint_ok"] and not rows.loc["b", "disjoint_ok"]
    assert "overlaps 'b'" in rows.loc["a", "detail"]
    assert not rows.loc["a", "roundtrip_ok"]
    assert rows.loc["a", "mismatched_bytes"] > 0
    block, region, offset = rows.loc["a", "first_mismatch"]
    assert (block, region, offset) == (0, "conv", 0)
    assert not report.ok


def test_report_renders():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    report = verify_roundtrip(cfg, caches, apply_kv_cache_group_edits(cfg, caches))
    text = repr(report)
    assert text.startswith("RoundTripReport(OK: 1 layers, 1085440 bytes on cpu)")
    assert "every byte came back" in text
    assert "<table" in report._repr_html_()


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
    with pytest.raises(
        ValueError, match=r"expected a multiple of the config's num_blocks=3"
    ):
        verify_roundtrip(wrong, caches, edited)


def test_untouched_non_mamba_registration_round_trips():
    cfg, caches = legacy_registration([(["a", "b"], qwen_attn())], 2)
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited)
    assert report.ok and not report.table["edited"].any()


@pytest.mark.gpu
@gpu
def test_qwen_round_trip_on_gpu():
    for builder in (unified_registration, legacy_registration):
        cfg, caches = builder(qwen_groups(2), 8, kernel=32, device="cuda")
        edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
        assert all(
            v.device.type == "cuda"
            for v in edited.values()
            for v in ([v] if isinstance(v, torch.Tensor) else v)
        )
        report = verify_roundtrip(cfg, caches, edited)
        assert report.ok, report
        assert report.device.startswith("cuda")


def test_many_small_chunks_restore_every_byte_and_match_one_chunk():
    cfg, caches = unified_registration(qwen_groups(2), 5, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    randomize(caches, seed=3)
    before = snapshot(caches)
    small = verify_roundtrip(cfg, caches, edited, chunk_bytes=1)  # one block a step
    assert small.ok, small
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(caches), strict=True))
    big = verify_roundtrip(
        cfg, caches, edited, blocks=[4, 0, 1, 2], chunk_bytes=1 << 40
    )
    assert big.ok and big.table["blocks"].tolist() == [4] * 8
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(caches), strict=True))
    columns = ["layer", "regions", "roundtrip_ok", "covers_ok", "confined_ok"]
    assert small.table[columns].equals(big.table[columns])


def test_uncovered_bytes_are_counted_exactly_per_block():
    cfg, caches = unified_registration([(["g"], qwen_gdn())], 3)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    view = edited["g"]
    rows = view.shape[1] // 2  # only the first half of each page's token rows
    edited["g"] = view.as_strided((3, rows, *view.shape[2:]), view.stride())
    report = verify_roundtrip(cfg, caches, edited)
    row = report.table.iloc[0]
    registered = caches["g"][0].numel() * caches["g"][0].element_size()
    covered = rows * view.shape[-1] * view.element_size()
    assert not report.ok and not row["covers_ok"] and row["confined_ok"]
    assert row["uncovered_bytes"] == 3 * (registered - covered)
    assert "misses registered bytes of blocks [0, 1, 2]" in row["detail"]


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


def test_stacked_layers_fill_their_own_bytes_with_their_own_pattern():
    from kvexplore.editing.proof import layers_under_test
    from kvexplore.editing.tiling import Group

    cfg, caches = unified_registration([(["a", "b", "c"], qwen_gdn())], 3)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    # vLLM's layer-compact registration: the three layers are one stack,
    # filled and compared through one [3, blocks, span] view each step.
    assert [
        len(s.layers) for s in Group.of(layers_under_test(cfg, caches, edited)).stacks
    ] == [3]
    legacy_cfg, legacy = legacy_registration([(["a", "b", "c"], qwen_gdn())], 3)
    legacy_edited = apply_kv_cache_group_edits(legacy_cfg, legacy)
    stacks = Group.of(layers_under_test(legacy_cfg, legacy, legacy_edited)).stacks
    assert [len(s.layers) for s in stacks] == [1, 1, 1]  # separate buffers

    state = 1_085_440  # conv + SSM bytes of a 1,114,112-byte page
    (flat,) = storage_bytes(caches)  # one allocation, layer-compact: a | b | c

    def page_states():
        pages = flat.reshape(9, QWEN_PAGE)[:, :state]
        return sorted(bytes(page.numpy()) for page in pages)

    # chunk_bytes: one tile holds all three blocks, and the load rotates them;
    # the default tile holds one block of the three layers, which rotate.
    report = verify_roundtrip(cfg, caches, edited, restore=False, chunk_bytes=1 << 30)
    assert report.ok, report
    block_turned = page_states()
    assert verify_roundtrip(cfg, caches, edited, restore=False).ok
    # The same nine page patterns, moved whole: only their places differ.
    assert page_states() == block_turned and len(set(block_turned)) == 9
    pages = {
        name: flat[i * 3 * QWEN_PAGE : (i + 1) * 3 * QWEN_PAGE].reshape(3, QWEN_PAGE)
        for i, name in enumerate("abc")
    }
    for name, page in pages.items():
        assert bool((page[:, :state] != 0).all()), name  # every state byte filled
        assert bool((page[:, state:] == 0).all()), name  # padding never written
    assert not torch.equal(pages["a"][0, :state], pages["b"][0, :state])
    assert not torch.equal(pages["a"][0, :state], pages["a"][1, :state])
    conv = 3 * 6144 * 2
    assert not torch.equal(pages["a"][0, :64], pages["a"][0, conv : conv + 64])


def test_unified_k_and_v_get_different_patterns():
    cfg, caches = unified_registration([(["k"], qwen_attn())], 2, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    assert verify_roundtrip(cfg, caches, edited, restore=False).ok
    page = storage_bytes(caches)[0][:QWEN_PAGE]
    row = page[: 2 * 256 * 2].reshape(2, 256 * 2)  # first token row: K | V
    assert bool((page != 0).all()) and not torch.equal(row[0], row[1])


def test_a_stack_whose_views_cannot_be_written_is_reported_layer_by_layer():
    cfg, caches = unified_registration([(["a", "b", "c"], qwen_gdn())], 2)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    for name, view in edited.items():  # every token row aliases row 0
        strides = (view.stride(0), 0, *view.stride()[2:])  # [blocks, 544, 1, 2000]
        edited[name] = view.as_strided(view.shape, strides, view.storage_offset())
    randomize(caches, seed=5)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30)  # one tile
    rows = report.table.set_index("layer")
    for name in "abc":
        assert "cannot be stored/loaded" in rows.loc[name, "detail"], name
        assert not rows.loc[name, "covers_ok"] and not rows.loc[name, "ok"]
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(caches), strict=True))


@pytest.mark.parametrize("ne", [False, True], ids=["xor-max", "ne-any"])
def test_both_compare_kernels_pass_good_views_and_locate_a_bad_one(monkeypatch, ne):
    import kvexplore.editing.tiling as tiling

    # ne + any is what CUDA runs; force it here so the CPU suite covers it.
    kernel = "ne" if ne else "xor"
    monkeypatch.setattr(tiling, "compare_kernel", lambda device: kernel)
    cfg, caches = unified_registration(qwen_groups(2), 3, kernel=32)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    assert verify_roundtrip(cfg, caches, edited).ok
    # Two layers registered on the same bytes: b's fill overwrites a's
    # pattern, and a's load into the other block moves b's bytes; only the
    # compare (not the address arithmetic) says which bytes came back wrong.
    spec = qwen_gdn()
    states = legacy_mamba(spec, 2)
    cfg = config([(["a", "b"], spec)], 2)
    caches = {"a": states, "b": list(states)}
    report = verify_roundtrip(
        cfg, caches, apply_kv_cache_group_edits(cfg, caches), chunk_bytes=1 << 30
    )
    rows = report.table.set_index("layer")
    for name in "ab":
        assert rows.loc[name, "mismatched_bytes"] == 2 * 1_085_440  # every state byte
        assert rows.loc[name, "first_mismatch"] == (0, "conv", 0)
        assert not rows.loc[name, "roundtrip_ok"]


def test_compare_outputs_of_mixed_widths_need_no_byte_by_byte_pass(monkeypatch):
    from vllm.v1.kv_cache_interface import MambaSpec

    import kvexplore.editing.tiling as tiling
    from kvexplore.editing.proof import layers_under_test

    # Conv and SSM state 9 bytes apart in a 64-byte page: two fill views, 15
    # uint8 bytes then 32 bytes read as int64 words, so the compare outputs
    # need a gap between them.
    spec = MambaSpec(
        block_size=16,
        shapes=((3, 5), (2, 4)),
        dtypes=(torch.int8, torch.float32),
        page_size_padded=64,
        mamba_cache_mode="align",
    )
    cfg = config([(["m", "n"], spec)], 4)
    caches = {}
    for name in "mn":
        raw = torch.zeros(4 * 64, dtype=torch.uint8)
        conv = raw.view(torch.int8).as_strided((4, 3, 5), (64, 5, 1), 0)
        ssm = raw.view(torch.float32).as_strided((4, 2, 4), (16, 4, 1), 6)
        caches[name] = [conv, ssm]
    located = []
    real_locate = tiling.locate
    monkeypatch.setattr(
        tiling, "locate", lambda *a: located.append(a) or real_locate(*a)
    )
    report = verify_roundtrip(cfg, caches, caches, restore=False)
    assert report.ok, report
    assert report.table["regions"].tolist() == ["conv,ssm"] * 2
    assert located == []  # the gap was zeroed: no false alarm, no slow pass
    group = tiling.Group.of(layers_under_test(cfg, caches, caches))
    scratch = torch.empty(group.scratch_bytes(4), dtype=torch.uint8)
    gaps = group.views(4, scratch)[3]
    assert [g.numel() for g in gaps] == [4, 4]  # 60 -> 64 and 252 -> 256 bytes


def test_long_rows_are_split_so_the_pattern_ramp_stays_small():
    from kvexplore.editing.tiling import pattern_bytes, split_rows

    page = 16_900_096  # a Nemotron-H Mamba page's conv + SSM bytes
    raw = torch.zeros(2 * page, dtype=torch.uint8)
    span = raw.as_strided((2, page), (page, 1)).view(torch.int64)
    rows = split_rows(span)
    assert rows.data_ptr() == span.data_ptr() and rows.ndim == 3
    assert rows.stride(-1) == 1 and rows.stride(0) == span.stride(0)
    assert rows.shape[1] * rows.shape[2] == span.shape[1]
    assert 1024 <= rows.shape[2] * 8 <= 16384
    assert pattern_bytes(span) == page and pattern_bytes(rows) < 400_000
    prime = torch.zeros(2, 4099, dtype=torch.int64)  # no divisor gives such rows
    assert split_rows(prime) is prime
    short = torch.zeros(2, 512, dtype=torch.int64)  # 4 KiB rows already
    assert split_rows(short) is short


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
    assert not report.ok and report.failures()["layer"].tolist() == [
        "model.layers.3.0"
    ]
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


def test_the_callers_thread_count_is_restored():
    threads = torch.get_num_threads()
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    edited = apply_kv_cache_group_edits(cfg, caches)
    torch.set_num_threads(2)
    try:
        assert verify_roundtrip(cfg, caches, edited, threads=1).ok
        assert torch.get_num_threads() == 2
        assert verify_roundtrip(cfg, caches, edited).ok
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match=r"threads=0 is invalid"):
            verify_roundtrip(cfg, caches, edited, threads=0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("chunk_bytes", [None, 1 << 30], ids=["block-tiles", "one-tile"])
def test_bytes_the_edited_view_misses_are_lost_in_the_data_too(chunk_bytes):
    cfg, caches = unified_registration(qwen_groups(2), 3, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    # Group 1's first layer keeps only token rows 0-499 of its [544, 2000]
    # page view: bytes 1,000,000 to 1,085,440 of each page (the state's end)
    # are never stored.  Group 1 shares its registered views with group 0,
    # so it starts from group 0's pattern; group 2 repeats group 0's views
    # and is not run again.
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    randomize(caches, seed=3)
    before = snapshot(caches)
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
    rows = report.table.set_index("layer")
    lost = 3 * (1_085_440 - 1_000_000)
    bad = rows.loc["model.layers.1.0"]
    assert bad["mismatched_bytes"] == lost == bad["uncovered_bytes"]
    conv = 3 * 6144 * 2
    assert bad["first_mismatch"] == (0, "ssm", 1_000_000 - conv)
    assert rows.drop(index="model.layers.1.0")["ok"].all()
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(caches), strict=True))


def test_a_stack_that_rotates_its_layers_loses_the_missed_bytes_of_each():
    from kvexplore.editing.proof import layers_under_test
    from kvexplore.editing.tiling import Group

    # Three 1,114,112-byte GDN pages per block do not leave room for a second
    # block in the default 4 MiB tile: each tile is one block of the three
    # layers of a group, which the load rotates (layer l's bytes go to
    # layer l + 2, cyclically).
    cfg, caches = unified_registration(qwen_groups(3), 2, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    names = [f"model.layers.1.{i}" for i in range(3)]
    for name in names:  # every layer of group 1 misses its state's last bytes
        edited[name] = edited[name][:, :500]
    group = Group.of([t for t in layers_under_test(cfg, caches, edited) if t.group == 1])
    assert [len(s.layers) for s in group.stacks] == [3]
    assert group.stacks[0].axis(1) == 0  # one block: the layers rotate
    report = verify_roundtrip(cfg, caches, edited)
    rows = report.table.set_index("layer")
    lost = 2 * (1_085_440 - 1_000_000)
    for name in names:
        assert rows.loc[name, "mismatched_bytes"] == lost == rows.loc[name, "uncovered_bytes"]
        assert rows.loc[name, "first_mismatch"] == (0, "ssm", 1_000_000 - 3 * 6144 * 2)
    assert rows.drop(index=names)["ok"].all()


def test_groups_repeating_each_others_views_run_once_and_each_reports_the_loss(
    monkeypatch,
):
    import kvexplore.editing.tiling as tiling

    # One tile of five blocks: the three GDN groups overlay the same bytes
    # through the same views, so only the first of them and the attention
    # group run; every layer is still reported.
    cfg, caches = unified_registration(qwen_groups(2), 5, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    ran = []
    real_run = tiling.Group.run

    def spy(self, *args, **kwargs):
        ran.append(self.layers[0].layer.name)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(tiling.Group, "run", spy)
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30)
    assert report.ok and len(report.table) == 8
    # the attention group first: its pages hold the GDN state it starts from
    assert ran == ["model.layers.3.0", "model.layers.0.0"]
    # the report says which layers stood in for which
    table = report.table.set_index("layer")
    stood_in = table["checked_with"].dropna().to_dict()
    assert stood_in == {
        f"model.layers.{g}.{i}": f"model.layers.0.{i}" for g in (1, 2) for i in (0, 1)
    }
    assert "data checked once with model.layers.0.1" in table.loc["model.layers.2.1", "detail"]
    assert table.loc["model.layers.0.1", "detail"] == "every byte came back"
    # Every GDN group's first layer misses the last 85,440 state bytes of
    # each page, the same way: still one run for the three, and each of
    # them reports the five pages' loss, counted by hand.
    lost = 5 * (1_085_440 - 1_000_000)
    names = [f"model.layers.{g}.0" for g in range(3)]
    for name in names:
        edited[name] = edited[name][:, :500]
    ran.clear()
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).table
    rows = rows.set_index("layer")
    assert ran == ["model.layers.3.0", "model.layers.0.0"]
    for name in names:
        assert rows.loc[name, "mismatched_bytes"] == lost
        assert rows.loc[name, "first_mismatch"] == (0, "ssm", 1_000_000 - 3 * 6144 * 2)
    assert rows.drop(index=names)["ok"].all()
    # Group 1's edit alone differs: it runs on its own, and only it loses.
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    edited["model.layers.1.0"] = edited["model.layers.1.0"][:, :500]
    ran.clear()
    rows = verify_roundtrip(cfg, caches, edited, chunk_bytes=1 << 30).table
    rows = rows.set_index("layer")
    assert ran == ["model.layers.3.0", "model.layers.0.0", "model.layers.1.0"]
    assert pd.isna(rows.loc["model.layers.1.0", "checked_with"])
    assert rows.loc["model.layers.2.0", "checked_with"] == "model.layers.0.0"
    assert rows.loc["model.layers.1.0", "mismatched_bytes"] == lost
    assert rows.drop(index="model.layers.1.0")["ok"].all()


def test_saved_spans_of_a_window_become_one_strided_view_each_run():
    from kvexplore.editing.tiling import _strided

    flat = torch.arange(100, dtype=torch.uint8)
    # three 5-byte spans 20 apart, then two of other lengths
    views = _strided(flat, [[10, 15], [30, 35], [50, 55], [60, 62], [70, 80]])
    assert [tuple(v.shape) for v in views] == [(3, 5), (2,), (10,)]
    got = sorted(int(x) for v in views for x in v.flatten())
    want = [*range(10, 15), *range(30, 35), *range(50, 55), 60, 61, *range(70, 80)]
    assert got == want
    # equal lengths at unequal steps stay apart
    views = _strided(flat, [[0, 4], [10, 14], [30, 34]])
    assert [tuple(v.shape) for v in views] == [(2, 4), (4,)]
    assert [int(v.flatten()[0]) for v in views] == [0, 30]


def test_layers_that_repeat_a_layout_further_on_keep_their_own_pages():
    from edit_layouts import QWEN_PAGE

    # Three layers with one layout, 0, 1 and 2 pages into one buffer: the
    # second layer's block 0 is the first layer's block 1, the third layer
    # clears both.  The address checks look at the layout once; the page
    # intervals of each layer must still sit where its own views are.
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


def test_a_layer_whose_regions_leave_a_gap_is_not_filled_as_its_neighbours_span():
    from kvexplore.editing.proof import layers_under_test
    from kvexplore.editing.tiling import TiledLayer

    spec = qwen_gdn()
    a = legacy_mamba(spec, 2)
    conv, ssm = legacy_mamba(spec, 2)
    # same shapes, but 16 bytes between conv and ssm
    gap = ssm.as_strided(ssm.shape, ssm.stride(), ssm.storage_offset() + 4)
    cfg = config([(["a", "b", "c"], spec)], 2)
    caches = {"a": a, "b": [conv, gap], "c": legacy_mamba(spec, 2)}
    spans: dict = {}
    tiled = [
        TiledLayer.of(i, t, spans)
        for i, t in enumerate(layers_under_test(cfg, caches, caches))
    ]
    assert [len(t.fills) for t in tiled] == [1, 2, 1]
    assert len(spans) == 2  # a and c share one answer
    # the shared answer is placed on each layer's own bytes
    for t, states in zip(tiled[::2], (a, caches["c"]), strict=True):
        fill = t.fills[0].view
        assert fill.untyped_storage().data_ptr() == states[0].untyped_storage().data_ptr()
        assert fill.storage_offset() == states[0].storage_offset() * 2


def test_a_group_too_big_for_one_tile_block_is_tiled_one_layer_and_many_blocks():
    from kvexplore.editing.proof import layers_under_test
    from kvexplore.editing.tiling import TiledLayer, _tiling, default_chunk_bytes

    # Six 1,114,112-byte GDN pages per block exceed the 4 MiB tile: a tile is
    # one layer and three consecutive blocks (3 x 1,114,112 <= 4 MiB < 4 x).
    cfg, caches = unified_registration(qwen_groups(6), 5, kernel=32)
    edited = dict(apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD"))
    members: dict = {}
    for i, t in enumerate(layers_under_test(cfg, caches, edited)):
        members.setdefault(t.group, []).append(TiledLayer.of(i, t))
    assert _tiling(members, default_chunk_bytes(torch.device("cpu"))) == (3, 1)
    # Blocks 0-2 and 3-4 rotate within their tile; every page of the one
    # layer that misses its state's last 85,440 bytes loses them.
    edited["model.layers.1.4"] = edited["model.layers.1.4"][:, :500]
    rows = verify_roundtrip(cfg, caches, edited).table.set_index("layer")
    lost = 5 * (1_085_440 - 1_000_000)
    assert rows.loc["model.layers.1.4", "mismatched_bytes"] == lost
    assert rows.loc["model.layers.1.4", "first_mismatch"] == (0, "ssm", 1_000_000 - 3 * 6144 * 2)
    assert rows.drop(index="model.layers.1.4")["ok"].all()
