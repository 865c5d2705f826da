"""Renderers: text forms compared, figures checked for segments (labels, counts)."""

import re

import pandas as pd
import pytest

import kvexplore
from kvexplore.errors import KVExploreError
from kvexplore.rendering import layouts as viz
from kvexplore.rendering.segments import MAX_DRAWN_SEGMENTS

QWEN = "Qwen/Qwen3.5-0.8B"


class _Seg:
    def __init__(self, label):
        self.label = label

    def get_label(self):
        return self.label


def _rects(fig):
    """One entry per drawn segment rectangle (rows are PatchCollections)."""
    out = []
    for ax in fig.axes:
        for coll in ax.collections:
            labels = getattr(coll, "segment_labels", None)
            if labels is not None:
                assert len(labels) == len(coll.get_paths())
                out += [_Seg(label) for label in labels]
    return out


def _axes_texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_mamba_page_is_conv_ssm_pad(qwen_a100_flashinfer):
    lay = viz.page_layout(qwen_a100_flashinfer, 0)
    assert [(s.label, s.start, s.size, s.dtype) for s in lay.segments] == [
        ("conv", 0, 36864, "bfloat16"),
        ("ssm", 36864, 1048576, "float32"),
        ("pad", 1085440, 28672, ""),
    ]
    assert lay.page_bytes == 1114112 and lay.padding_bytes == 28672


def test_mamba_page_same_bytes_in_both_registrations(qwen_a100_flashinfer):
    uni = viz.page_layout(qwen_a100_flashinfer, 0, registration="unified")
    leg = viz.page_layout(qwen_a100_flashinfer, 0, registration="legacy")
    assert uni.segments == leg.segments
    assert "[16, 1, 1, 1085440] int8, strides (1114112, 1085440, 1085440, 1)" in uni.views[0]
    assert leg.views[1].startswith("[16, 16, 128, 128] float32")


def test_attention_unified_flashinfer_17_kernel_pages(qwen_a100_flashinfer):
    lay = viz.page_layout(qwen_a100_flashinfer, 3)
    assert lay.kernel_block_size == 32 and lay.kernel_pages == 17
    assert [s.label for s in lay.segments] == [f"K|V p{p}" for p in range(17)]
    assert {s.size for s in lay.segments} == {65536}
    # K and V side by side inside C, per token per head, token outside head (LBNHC)
    assert [(c.label, c.start, c.size) for c in lay.cells[:4]] == [
        ("K t0 h0", 0, 512), ("V t0 h0", 512, 512), ("K t0 h1", 1024, 512), ("V t0 h1", 1536, 512)]
    assert "token stride 2,048 B, head stride 1,024 B" in lay.cells_note


def test_attention_legacy_kv_dim_second(qwen_a100_flashinfer):
    lay = viz.page_layout(qwen_a100_flashinfer, 3, registration="legacy")
    labels = [s.label for s in lay.segments]
    assert labels[:4] == ["K p0", "V p0", "K p1", "V p1"] and len(labels) == 34
    assert lay.segments[1].start == 32768 and lay.segments[2].start == 65536


def test_flash_attn_is_one_page(qwen_a100):
    lay = viz.page_layout(qwen_a100, 3)
    assert lay.kernel_block_size == 544 and lay.kernel_pages == 1
    assert [s.label for s in lay.segments] == ["K|V p0"]
    assert "1 page for a 544-token block" in lay.text()


def test_edited_view_coordinates_fall_on_bytes(qwen_a100_flashinfer):
    lay = viz.page_layout(qwen_a100_flashinfer, 3, edited=True)
    e = lay.edited
    assert e.rule == "subpaged-attention-view"
    assert e.shape == (2, 544, 1, 512) and e.stride == (278528, 512, 512, 1)
    assert [(s.label, s.start, s.size) for s in e.segments] == [
        ("[0, :, :, :]", 0, 557056), ("[1, :, :, :]", 557056, 557056)]
    # synthetic "K" half [0] covers K|V kernel pages 0-8, page 8 only half
    assert e.falls_on[0] == "K|V p0-8 (K|V p8: 32768 of 65536 B)"
    leg = viz.page_layout(qwen_a100_flashinfer, 3, registration="legacy", edited=True).edited
    assert leg.falls_on == ("K p0-8, V p0-7", "V p8-16, K p9-16")


def test_edited_mamba_unified_row(qwen_a100_flashinfer):
    e = viz.page_layout(qwen_a100_flashinfer, 0, edited=True).edited
    assert e.rule == "mamba-unified-view" and e.shape == (544, 1, 2000)
    assert e.segments[0].size == 544 * 2000
    assert e.falls_on[0] == "conv, ssm, pad (pad: 2560 of 28672 B)"


def test_block_offset_and_text_is_deterministic(qwen_a100_flashinfer):
    a = viz.page_map_text(qwen_a100_flashinfer, 3, block=2, edited=True)
    assert a == viz.page_map_text(qwen_a100_flashinfer, 3, block=2, edited=True)
    assert "block 2: page starts at byte 2,228,224 of the backing buffer" in a
    assert "0x" not in a


def test_mla_page(qwen_a100):
    ds = kvexplore.plan("deepseek-ai/DeepSeek-V3", gpu="A100", num_blocks=16)
    lay = viz.page_layout(ds, 0)
    assert lay.kind == "mla_attention"
    assert [s.kind for s in lay.segments] == ["latent"]
    assert [c.label for c in lay.cells[:2]] == ["c_kv t0", "k_pe t0"]
    assert (lay.cells[0].size, lay.cells[1].size) == (1024, 128)


def test_sliding_window_page_is_labelled():
    g = kvexplore.plan("google/gemma-3-1b-it", gpu="A100")
    pos = next(i for i, info in enumerate(g.layers) if info.kind == "sliding_window")
    lay = viz.page_layout(g, pos)
    assert lay.spec == "SlidingWindowSpec"
    assert any("sliding window" in n for n in lay.notes)
    assert lay.segments[0].label == "K|V p0"


@pytest.mark.parametrize("bad, match", [
    (24, r"layer=24 is out of range .* expected 0..23"),
    (-1, r"layer=-1 is out of range"),
    ("nope", r"layer 'nope' is not a KV-cache layer"),
])
def test_bad_layer(qwen_a100_flashinfer, bad, match):
    with pytest.raises(KVExploreError, match=match):
        viz.page_layout(qwen_a100_flashinfer, bad)


def test_bad_block_and_registration(qwen_a100_flashinfer):
    with pytest.raises(ValueError, match=r"block=16 is out of range; expected 0..15"):
        viz.page_layout(qwen_a100_flashinfer, 0, block=16)
    with pytest.raises(ValueError, match=r"registration='new' is invalid"):
        viz.page_map(qwen_a100_flashinfer, 0, registration="new")


def test_an_edited_value_that_is_no_view_is_refused(qwen_a100_flashinfer):
    import torch

    with pytest.raises(KVExploreError, match=r"is a 0-D tensor; expected this layer's edited view"):
        viz.page_layout(qwen_a100_flashinfer, 0, edited=torch.tensor(1.0))
    name = qwen_a100_flashinfer.layers[3].name
    with pytest.raises(KVExploreError, match=rf"edited value of layer '{re.escape(name)}' is str"):
        viz.page_layout(qwen_a100_flashinfer, 3, edited={name: "a view"})


def test_sweep_heatmap_of_something_else_is_refused():
    for draw in (viz.sweep_heatmap, viz.sweep_heatmap_text):
        with pytest.raises(KVExploreError, match=r"df is a str; expected the DataFrame of a sweep"):
            draw("not a df", "tp", "dcp", "block")


def test_page_map_figure_segments(qwen_a100_flashinfer):
    fig = viz.page_map(qwen_a100_flashinfer, 3, edited=True)
    labels = [r.get_label() for r in _rects(fig)]
    assert sum(label.startswith("K|V p") for label in labels) == 17
    assert sum(label.startswith("K t") for label in labels) == 4
    assert labels.count("[0, :, :, :]") == 1 and labels.count("[1, :, :, :]") == 1
    fig = viz.page_map(qwen_a100_flashinfer, 3, registration="legacy")
    labels = [r.get_label() for r in _rects(fig)]
    assert sum(label.startswith("K p") for label in labels) == 17
    assert sum(label.startswith("V p") for label in labels) == 17
    fig = viz.page_map(qwen_a100_flashinfer, 0)
    assert [r.get_label() for r in _rects(fig)] == ["conv", "ssm", "pad"]
    assert {"ssm"} <= set(_axes_texts(fig))


def test_figure_rectangles_are_capped():
    nem = kvexplore.plan("nvidia/Nemotron-H-56B-Base-8K", attention_backend="FLASHINFER", gpu="A100",
                           num_blocks=16)
    pos = next(i for i, info in enumerate(nem.layers) if info.kind != "mamba")
    lay = viz.page_layout(nem, pos, registration="legacy")
    assert len(lay.segments) == 2 * lay.kernel_pages > MAX_DRAWN_SEGMENTS
    rects = _rects(lay.figure())
    assert len(rects) == MAX_DRAWN_SEGMENTS + len(lay.cells)
    assert "..." in [r.get_label() for r in rects]


def test_buffer_map_unified_overlay(qwen_a100_flashinfer):
    lay = viz.buffer_layout(qwen_a100_flashinfer)
    assert [r.name for r in lay.rows] == [
        "tensor 0 (group 0, MambaSpec)", "tensor 1 (group 1, MambaSpec)",
        "tensor 2 (group 2, MambaSpec)", "tensor 3 (group 3, FullAttentionSpec)"]
    row = lay.rows[0]
    assert row.size == 106954752 and [s.start for s in row.segments][:2] == [0, 17825792]
    assert "padding 28,672 B at the end of each page" in row.detail
    assert any("overlay one backing buffer" in n for n in lay.notes)
    assert [s.label for s in lay.block_zoom[:2]] == ["b0", "pad"]
    text = viz.buffer_map_text(qwen_a100_flashinfer)
    assert "layer_stride 17,825,792 B, block_stride 1,114,112 B" in text
    fig = viz.buffer_map(qwen_a100_flashinfer)
    assert sum(r.get_label() == "pad" for r in _rects(fig)) == 8


def test_buffer_map_legacy(qwen_a100_flashinfer):
    lay = viz.buffer_layout(qwen_a100_flashinfer, registration="legacy")
    assert len(lay.rows) == 6 and lay.rows[0].size == 16 * 1114112
    assert "shared by g0:L0, g1:L1, g2:L2, g3:L3" in lay.rows[0].detail
    text = viz.buffer_map_text(qwen_a100_flashinfer, registration="legacy")
    assert "... 10 more segments with the same stride" in text


def test_sweep_heatmap_numeric_and_bool():
    df = pd.DataFrame({"tp": [1, 2, 1, 2], "dcp": [1, 1, 2, 2],
                       "block": [544, 272, 544, 272], "ok": [True, False, True, True]})
    text = viz.sweep_heatmap_text(df, "tp", "dcp", "block")
    assert text.splitlines()[0] == "block over dcp (rows) x tp (columns)"
    assert viz.sweep_table(df, "tp", "dcp", "ok").to_numpy().tolist() == [[1, 0], [1, 1]]
    fig = viz.sweep_heatmap(df, "tp", "dcp", "ok")
    assert sorted(_axes_texts(fig)) == ["0", "1", "1", "1"]


def test_sweep_heatmap_names_the_model_and_gpu_it_holds_fixed():
    df = pd.DataFrame({"model": ["Qwen/Qwen3.5-0.8B"] * 4, "gpu": ["A100"] * 4,
                       "tp": [1, 2, 1, 2], "dcp": [1, 1, 2, 2], "block": [544, 272, 544, 272]})
    fig = viz.sweep_heatmap(df, "tp", "dcp", "block")
    assert fig.axes[0].get_title() == "block: Qwen/Qwen3.5-0.8B on A100"
    text = viz.sweep_heatmap_text(df, "tp", "dcp", "block")
    assert text.splitlines()[0] == (
        "block over dcp (rows) x tp (columns), Qwen/Qwen3.5-0.8B on A100"
    )
    # An axis that varies the GPU leaves it out of the title; several models
    # are counted.
    two = df.assign(gpu=["A100", "A100", "H100", "H100"], model=["a", "b", "a", "b"])
    assert viz.sweep_heatmap(two, "tp", "gpu", "block").axes[0].get_title() == (
        "block: 2 models"
    )


def test_sweep_heatmap_errors():
    df = pd.DataFrame({"tp": [1, 1], "dcp": [1, 1], "error": ["x", None], "v": [1, 2]})
    with pytest.raises(KVExploreError, match=r"x='nope' is not a column"):
        viz.sweep_heatmap(df, "nope", "dcp", "v")
    with pytest.raises(KVExploreError, match=r"value='error' has dtype \w+; expected a numeric"):
        viz.sweep_heatmap(df, "tp", "dcp", "error")
    with pytest.raises(KVExploreError, match=r"1 rows repeat an \(tp, dcp\) pair"):
        viz.sweep_heatmap_text(df, "tp", "dcp", "v")


def test_plan_html_escapes_and_has_tables(qwen_a100_flashinfer):
    html = qwen_a100_flashinfer._repr_html_()
    assert html.count("<table") == 2 and "derivation" in html
    assert "544 = 16 x cdiv(1085440, 16 x 2048)" in html


def test_table_html_escapes():
    from kvexplore.rendering.html import message_html, table_html

    assert "&lt;script&gt;" in table_html([{"a": "<script>"}])
    assert "<script>" not in message_html("<script>alert(1)</script>")
    cells = re.findall(r"<td>(.*?)</td>", table_html(pd.DataFrame({"x": [1.5, float("nan")]})))
    assert cells == ["1.5", "-"]  # NaN shows as a dash, never as "nan"


def test_buffer_map_zoom_labels_every_block_it_shows():
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=16)  # the zoom shows 8
    lay = kvexplore.buffer_layout(p)
    blocks = [s.label for s in lay.block_zoom if s.label != "pad"]
    assert blocks == [f"b{b}" for b in range(8)]
    texts = {t.get_text() for t in lay.figure().axes[0].texts}
    assert set(blocks) <= texts
