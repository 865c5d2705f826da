"""Explorer logic driven through the widget's controls, no browser."""

import json
import re
from html import escape

import pytest

from kvexplore.explorer.state import PANELS, ExplorerState
from kvexplore.explorer.widgets import Explorer
from kvexplore.planning.release import release_name
from kvexplore.rendering.html import comparison_table_html

QWEN = "Qwen/Qwen3.5-0.8B"


@pytest.fixture()
def ex():
    return Explorer(QWEN, gpu="A100")


def test_initial_panels(ex):
    s = ex.state
    assert s.error is None and s.plan.block_size == 544
    assert set(s.panels) == set(PANELS)
    assert "block_size: 544 = 16 x cdiv(1085440, 16 x 2048)" in s.panels["summary"].text
    assert "tokens_per_gib" in s.panels["memory"].text
    assert "conv" in s.panels["page_map"].text
    for name in PANELS:
        assert ex.panels[name].value == s.panels[name].html


def test_backend_and_layer_change_page_map(ex):
    ex.controls["layer"].value = 3
    assert "1 page for a 544-token block" in ex.state.panels["page_map"].text
    before_summary = ex.panels["summary"].value
    ex.controls["attention_backend"].value = "FLASHINFER"
    text = ex.state.panels["page_map"].text
    assert "17 kernel pages x 65,536 B (kernel block 32 of a 544-token block)" in text
    assert "K|V p16" in ex.panels["page_map"].value
    assert ex.panels["summary"].value != before_summary
    assert "FLASHINFER" in ex.state.panels["summary"].text


def test_registration_changes_page_map_and_edits_only(ex):
    ex.controls["layer"].value = 3
    changed = ex.state.set(registration="legacy")
    assert changed == ("page_map", "edits")
    assert "K p0" in ex.state.panels["page_map"].text
    assert "mamba-page-view" in ex.state.panels["edits"].text
    ex.controls["registration"].value = "unified"
    assert "mamba-unified-view" in ex.state.panels["edits"].text


def test_view_only_change_keeps_plan_panels(ex):
    changed = ex.state.set(block=3)
    assert changed == ("page_map",)
    assert "block 3: page starts at byte 3,342,336" in ex.state.panels["page_map"].text


def test_tp_that_does_not_divide_heads_then_recovers(ex):
    ex.controls["tensor_parallel_size"].value = 3
    s = ex.state
    assert s.plan is None
    assert "tensor_parallel_size=3" in s.error and "divisible by tensor parallel size (3)" in s.error
    assert "tensor_parallel_size=3" in ex.panels["status"].value
    assert "Traceback" not in ex.panels["status"].value
    assert not s.panels["page_map"].ok
    ex.controls["tensor_parallel_size"].value = 4
    assert s.error is None and s.plan.block_size == 272
    assert s.panels["page_map"].ok


def test_a_pipeline_stage_from_the_controls(ex):
    ex.controls["pipeline_parallel_size"].value = 2
    ex.controls["pipeline_parallel_rank"].value = 1
    s = ex.state
    assert s.error is None
    assert (s.plan.pipeline_parallel_size, s.plan.pipeline_parallel_rank) == (2, 1)
    # stage 1 of Qwen3.5-0.8B holds layers 12-23 only
    assert {int(info.name.split(".")[3]) for info in s.plan.layers} == set(range(12, 24))
    ex.controls["pipeline_parallel_rank"].value = 2
    assert s.plan is None and "pipeline_parallel_rank=2" in s.error
    assert "pipeline_parallel_rank=2" in ex.panels["status"].value


def test_missing_and_non_json_config(ex, tmp_path):
    ex.controls["model"].value = str(tmp_path / "missing" / "config.json")
    assert "does not exist; expected a config.json file" in ex.state.error
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    ex.controls["model"].value = str(bad)
    assert "is not valid JSON" in ex.state.error
    assert "not valid JSON" in ex.panels["summary"].value
    ex.controls["model"].value = QWEN
    assert ex.state.error is None


def test_path_model_works(ex, tmp_path):
    from kvexplore.planning.models import load_model_config

    (tmp_path / "config.json").write_text(json.dumps(load_model_config(QWEN).config))
    ex.controls["model"].value = str(tmp_path)
    assert ex.state.error is None and ex.state.plan.block_size == 544


def test_block_size_the_backend_rejects_and_garbage(ex):
    ex.controls["model"].value = "meta-llama/Llama-3.1-8B-Instruct"
    ex.controls["attention_backend"].value = "FLASHINFER"
    ex.controls["block_size"].value = "24"
    assert "block_size=24" in ex.state.error and "block_size not supported" in ex.state.error
    assert "block_size not supported" in ex.panels["status"].value
    ex.controls["block_size"].value = "abc"
    assert ex.state.error == "block_size='abc' is invalid; expected 'auto' or an integer >= 1"
    ex.controls["block_size"].value = "auto"
    assert ex.state.error is None


def test_layer_and_block_out_of_range(ex):
    ex.controls["layer"].value = 99
    assert ex.state.error == (
        "layer=99 is out of range for Qwen/Qwen3.5-0.8B; expected 0..23 (24 KV-cache layers)")
    assert "layer=99" in ex.panels["page_map"].value
    assert ex.state.plan is not None and ex.state.panels["summary"].ok
    ex.controls["layer"].value = 2
    n = ex.state.plan.num_blocks  # sized for an A100 deployment
    ex.controls["block"].value = n
    assert ex.state.error == (
        f"block={n} is out of range; expected 0..{n - 1} ({n} blocks in this plan)")
    ex.controls["block"].value = 0
    assert ex.state.error is None and "linear_attn" in ex.layer_label.value


def test_offload_panel_deterministic(ex):
    text = ex.state.panels["offload"].text
    assert text.startswith("OffloadResult('Qwen/Qwen3.5-0.8B', tp=1, dcp=1, pp=1, groups=[0, 1, 2, 3]")
    assert "/tmp/" not in text and "<config_dir>" not in text
    lines = text.splitlines()
    # the OffloadingConfig names the model as vLLM was started with it
    assert "model.name = Qwen/Qwen3.5-0.8B: model_config.model (for Qwen/Qwen3.5-0.8B)" in lines
    assert "cache.tokens_per_hash = 544: gcd(544, 544, 544, 544) of the prefix-cacheable " \
        "groups' DCP-resolved block sizes" in lines
    assert text == ExplorerState(QWEN, gpu="A100").panels["offload"].text


def test_edits_rejected_shows_message():
    s = ExplorerState(QWEN, gpu="A100")
    s.set(mamba_cache_mode="none", enable_prefix_caching=False)
    assert s.plan is not None and s.plan.mamba_cache_mode == "none"
    panel = s.panels["edits"]
    assert panel.ok is False and "rejected" in panel.text and "mamba_cache_mode" in panel.text


def test_unknown_control_is_an_error():
    with pytest.raises(ValueError, match="unknown Explorer control"):
        ExplorerState(QWEN, layers=3)


def test_live_button_runs_roundtrip(ex):
    ex.controls["layer"].value = 3
    assert "not run" in ex.state.panels["live"].text
    ex.live_button.click()
    text = ex.state.panels["live"].text
    import torch

    # CPU: the first CPU_ROUNDTRIP_BLOCKS blocks; CUDA: every block
    if torch.cuda.is_available():
        where = r"on cuda \(unified, LMCache 0\.5\.6's edits, all blocks\)"
    else:
        where = r"on cpu \(unified, LMCache 0\.5\.6's edits, blocks \[0, 1\]\)"
    head = text.splitlines()[0]
    assert re.fullmatch(r"round-trip OK: 24 layers, [\d,]+ bytes " + where, head), head
    assert "every byte came back" in text
    assert "round-trip OK" in ex.panels["live"].value
    ex.controls["block"].value = 1  # view-only change keeps the result
    assert ex.state.panels["live"].text == text
    ex.controls["registration"].value = "legacy"  # new registration: stale
    assert "not run" in ex.state.panels["live"].text


def test_page_map_figure_on_by_default_and_memoised(ex):
    assert ex.figure_toggle.value is True
    first = ex.figure.value
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and ex.figure.layout.display == ""
    ex.controls["layer"].value = 3
    attn = ex.figure.value
    assert attn[:4] == b"\x89PNG" and attn != first
    ex.controls["layer"].value = 0
    # the same (plan, layer, block, registration): the memoised bytes object
    assert ex.figure.value == first and ex.state.page_map_png() is ex.state.page_map_png()
    ex.controls["block"].value = 1
    # a Mamba page looks the same in every block (offsets are page-relative);
    # the block is named in the panel's title, next to the image
    assert "registration, block 1:" in ex.state.panels["page_map"].html
    assert "block 1: page starts at byte 1,114,112" in ex.state.panels["page_map"].text
    ex.controls["layer"].value = 99
    assert ex.figure.layout.display == "none" and ex.state.page_map_png() is None
    ex.controls["layer"].value = 0
    assert ex.figure.layout.display == ""
    ex.figure_toggle.value = False
    assert ex.figure.layout.display == "none"


def test_model_control_offers_catalog_and_accepts_paths(ex):
    import kvexplore

    model = ex.controls["model"]
    assert list(model.options) == kvexplore.catalog_names() and QWEN in model.options
    assert model.ensure_option is False  # a path or a hub id is accepted too


def test_edit_groups_from_report():
    import pandas as pd

    from kvexplore.rendering.editing import edit_groups

    rows = [
        {"group": 0, "layer": "a", "kind": "mamba", "rule": "r1", "declined": "r0: no; rx: nope",
         "shape_before": (4, 8), "dtype_before": "int8", "shape_after": (4, 2, 4), "dtype_after": "int8"},
        {"group": 0, "layer": "b", "kind": "mamba", "rule": None, "declined": "r0: no",
         "shape_before": (4, 8), "dtype_before": "int8", "shape_after": (4, 8), "dtype_after": "int8"},
        {"group": 1, "layer": "c", "kind": "full_attention", "rule": "r2", "declined": None,
         "shape_before": (4, 2, 16), "dtype_before": "bfloat16", "shape_after": (4, 2, 16, 1),
         "dtype_after": "bfloat16"},
    ]
    g0, g1 = edit_groups(pd.DataFrame(rows))
    assert g0.rules == (("r1", 1), (None, 1)) and g1.rules == (("r2", 1),)
    assert g0.before == ("(4, 8) int8",) and g0.after == ("(4, 2, 4) int8", "(4, 8) int8")
    assert g0.declined == (("r0: no", 2), ("rx: nope", 1)) and g1.declined == ()
    assert g0.first_layer == "a" and [x[0] for x in g0.layers] == ["a", "b"]
    assert g0.text().splitlines()[0] == "group 0 (mamba, 2 layers): r1 x1, no rule (registered object kept) x1"


def test_edits_tab_summarises_per_group(ex):
    panel = ex.state.panels["edits"]
    lines = panel.text.splitlines()
    assert "group 0 (mamba, 6 layers): mamba-unified-view x6" in lines
    n = ex.state.plan.num_blocks
    assert f"  view before: ({n}, 1, 1, 1085440) int8" in lines
    assert f"  view after:  ({n}, 544, 1, 2000) int8" in lines
    assert "group 3 (full_attention, 6 layers): no rule (registered object kept) x6" in lines
    assert "  declined on 6 of 6: subpaged-attention-view: already paged at the logical " \
        "block size (544 tokens in dim 2)" in lines
    html = panel.html
    # one summary row per group; each layer's reasons only inside a closed <details>
    summary = html[html.index("<table", html.index("edits (unified)")):]
    summary = summary[:summary.index("</table>")]
    assert summary.count("<tr>") == 1 + 4
    assert html.count("per-layer reasons (6 layers)") == 4
    assert "<details><summary>per-layer reasons" in html and "<details open><summary>per-layer" not in html
    assert html.count('class="kvx-bar"') >= 8  # registered and edited bars per group
    outside = re.sub(r"<details>.*?</details>", "", html, flags=re.S)
    assert "language_model.model.layers.4.linear_attn" not in outside
    # the figures: drawn when the edits tab is shown
    assert ex.edit_figures.children == ()
    ex.tabs.selected_index = PANELS.index("edits")
    images = [w for w in ex.edit_figures.children if hasattr(w, "format")]
    assert len(images) == 4 and all(w.value[:4] == b"\x89PNG" for w in images)
    ex.controls["registration"].value = "legacy"
    assert "mamba-page-view x6" in ex.state.panels["edits"].text
    assert [w.value for w in ex.edit_figures.children if hasattr(w, "format")][0] != images[0].value


def test_compare_a100_h100():
    from kvexplore.explorer.state import compare

    c = compare({"model": QWEN, "gpu": "A100"}, gpu="H100")
    assert c.labels() == ("gpu=A100", "gpu=H100")
    assert (c.row("block_size").a, c.row("block_size").b) == ("544", "576")
    assert c.row("block_size").differs and c.row("kernel_block_sizes").differs
    assert c.row("kernel_block_sizes").b == "(576, 576, 576, 576)"
    assert not c.row("tensor_parallel_size").differs and not c.row("mamba_page_size").differs
    for group in range(4):  # page size marked where it differs, by fact
        assert c.row("page_bytes", f"group {group}").differs
    assert not c.row("real_page_bytes", "group 0").differs  # 1,085,440 B of state on both
    assert c.row("real_page_bytes", "group 3").differs  # the attention page is all real
    assert c.row("page_bytes", "page map").differs and not c.row("conv bytes", "page map").differs
    assert "page_bytes: 1114112 (A) vs 1179648 (B)" in c.page_map_callouts()
    assert "pad bytes: 28,672 (A) vs 94,208 (B)" in c.page_map_callouts()
    html = comparison_table_html(c)
    assert html.count('class="kvx-diff"') == len(c.differences) > 0
    assert html.count("<tr") == 1 + len(c.rows)
    assert "* plan       block_size" in c.text() and "  plan       tensor_parallel_size" in c.text()


def test_compare_tp_and_kv_cache_dtype():
    from kvexplore.explorer.state import compare

    base = {"model": QWEN, "gpu": "A100", "layer": 3}
    tp = compare(base, tensor_parallel_size=4)
    assert (tp.row("block_size").a, tp.row("block_size").b) == ("544", "272")
    assert not tp.row("kv_cache_dtype").differs
    fp8 = compare(base, kv_cache_dtype="fp8")
    assert fp8.row("kv_cache_dtype").b == "fp8"
    assert (fp8.row("kernel_block_size", "group 3").a, fp8.row("kernel_block_size", "group 3").b) == ("544", "16")
    assert fp8.row("kernel_pages", "page map").differs
    assert compare(fp8.a, fp8.b).rows == fp8.rows  # states are used as they are
    same = compare(base, {"gpu": "A100"})
    assert same.differences == () and "page maps: the compared numbers are the same" in same._repr_html_()
    bad = compare(base, tensor_parallel_size=3)
    assert "divisible by tensor parallel size (3)" in bad.b.error and bad.a.error is None
    assert f"B: {release_name()} rejects" in bad._repr_html_() and bad.row("block_size").b == "-"


def test_compare_widget_draws_both_page_maps():
    from kvexplore.explorer.widgets import Compare

    w = Compare({"model": QWEN, "gpu": "A100"}, gpu="H100")
    a, b = (f.value for f in w.figures)
    assert a[:4] == b[:4] == b"\x89PNG" and a != b
    assert "page maps differ in" in w.summary.value and 'class="kvx-diff"' in w.table.value
    first_b = w.states[1]
    w.controls_b["gpu"].value = "A100"
    assert w.comparison.differences == () and w.figures[1].value == w.figures[0].value
    assert w.states[1] is first_b and w.comparison.b is first_b  # the side's state is kept
    w.controls_b["tensor_parallel_size"].value = 3
    assert f"B: {release_name()} rejects" in w.summary.value and w.figures[1].layout.display == "none"


def test_text_form(ex):
    text = ex.text()
    assert [line for line in text.splitlines() if line.startswith("== ")] == [f"== {n} ==" for n in PANELS]
    assert text == ex.text()


def test_a_control_change_builds_its_page_layout_once(monkeypatch):
    import kvexplore.rendering.layouts as layouts

    calls = []
    real = layouts.page_layout

    def counting(plan, layer=0, **kwargs):
        calls.append((layer, kwargs.get("block"), kwargs.get("registration")))
        return real(plan, layer, **kwargs)

    monkeypatch.setattr(layouts, "page_layout", counting)
    state = ExplorerState(QWEN, gpu="A100")
    calls.clear()
    state.set(layer=5)  # a layer no panel has shown yet: the page map and its image
    assert state.page_map_png() is not None
    assert calls.count((5, 0, "unified")) == 1


def test_compare_refuses_what_is_not_controls():
    import kvexplore
    from kvexplore import KVExploreError

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=16)
    with pytest.raises(KVExploreError, match="a_controls is a Plan .*expected a mapping of Explorer controls"):
        kvexplore.compare(p, gpu="H100")
    with pytest.raises(KVExploreError, match="b_controls is a list"):
        kvexplore.compare({"model": "Qwen/Qwen3.5-0.8B"}, ["gpu", "H100"])


def test_a_refusal_turns_the_status_red_and_its_way_out_applies():
    """Mamba-Codestral-7B on an H100 at vLLM 0.31-0.33's defaults: more
    sequences than Mamba blocks.  The status is the red refusal; each way-out
    button names its flags and applying the first sets the controls and
    starts (vLLM 0.34's extensible cache holds enough blocks: no button)."""
    from kvexplore.explorer.widgets import Explorer

    e = Explorer("mistralai/Mamba-Codestral-7B-v0.1", gpu="H100")
    p = e.state.plan
    if p.admission.ok:
        assert e.way_out.children == ()
        return
    status = e.state.panels["status"]
    assert "kvx-error" in status.html and not status.ok
    assert p.admission.message in status.text
    ways = e.state.way_out()
    buttons = e.way_out.children[1:]
    assert [b.description for b in buttons] == [f"apply {w.flags}"[:60] for w in ways]
    buttons[0].click()
    assert e.state.plan.admission.ok and e.way_out.children == ()
    for name, value in ways[0].change.items():
        if name == "max_num_seqs":
            assert e.controls["max_num_seqs"].value == str(value)
            assert e.state.plan.vllm_config.scheduler_config.max_num_seqs == value


def test_the_advise_tab_recommends_and_applies():
    """The advise tab asks kvexplore.advise for the controls' model and GPU:
    its panel holds the recommendation's command, its figure is drawn, and
    applying it sets the controls to a plan that starts; a bad value is a
    message, not a traceback."""
    from kvexplore.advising import Workload, advise
    from kvexplore.explorer.widgets import Explorer

    e = Explorer("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", gpu="H100", max_model_len="32768")
    e.advise_button.click()  # the tab's defaults: one request, no shared prefix
    assert "kvx-error" not in e.advise_panel.value and e.state.advice.workload.shared_prefix == 0
    e.advise_controls["concurrency"].value = 16
    e.advise_controls["shared_prefix"].value = 1500
    e.advise_button.click()
    expected = advise("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", gpu="H100",
                      workload=Workload(max_model_len=32768, concurrency=16, shared_prefix=1500))
    assert escape(expected.command) in e.advise_panel.value
    assert e.advise_figure.value and e.advise_figure.layout.display == ""
    assert not e.advise_apply.disabled
    e.advise_apply.click()
    rec = expected.recommended
    assert e.state.plan.admission.ok
    seqs = e.state.plan.vllm_config.scheduler_config.max_num_seqs
    assert seqs == rec.get("max_num_seqs", seqs)
    assert e.controls["max_num_seqs"].value == str(rec.get("max_num_seqs", "auto"))
    e.advise_controls["concurrency"].value = 0
    e.advise_button.click()
    assert "concurrency" in e.advise_panel.value and "kvx-error" in e.advise_panel.value
    assert e.advise_apply.disabled


def test_status_warns_when_vllm_would_not_start():
    # Llama-3.1-8B's 128 KiB per token for 131,072 tokens is 16 GiB; a 24 GB card
    # holds ~16 GB of weights, which leaves far less for the cache
    s = ExplorerState("meta-llama/Llama-3.1-8B-Instruct", gpu="RTX 4090")
    p = s.plan
    assert p.bytes_per_token == 32 * 2 * 8 * 128 * 2 and p.max_model_len == 131072
    assert not p.admission.ok and s.error is None
    status = s.panels["status"]
    assert f"refused by {release_name()} at start-up" in status.text
    assert p.admission.message in status.text and "kvx-error" in status.html
    s.set(gpu="H100")
    assert s.plan.admission.ok and "refused" not in s.panels["status"].text


def test_a_release_control_only_where_another_release_can_answer(monkeypatch, tmp_path):
    """No other release's environment: no releases tab.  With vLLM 0.34.0's
    environment (created on first use), the tab compares the deployment the
    controls describe, each side that release's own block (544 / 576 tokens
    for Qwen3.5-0.8B on an A100)."""
    from kvexplore.versions import environment

    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(tmp_path))
    alone = Explorer("Qwen/Qwen3.5-0.8B", gpu="A100")
    assert alone.releases is None and "releases" not in alone.tabs.titles
    monkeypatch.delenv("KVEXPLORE_CACHE_DIR")
    environment("0.34.0")
    ex = Explorer("Qwen/Qwen3.5-0.8B", gpu="A100")
    assert ex.tabs.titles[-1] == "releases" and "0.34.0" in ex.releases.options
    ex.releases.value = ("0.33.0", "0.34.0")
    ex.releases_button.click()
    shown = ex.releases_panel.value
    assert "across vLLM 0.33.0, 0.34.0" in shown and 'class="kvx-bar"' in shown
    # the table of differences shown: the block_size row, one cell per release
    cells = re.findall(r"<td>([^<]*)</td>", shown[shown.index("<td>plan.block_size</td>"):])
    assert cells[:3] == ["plan.block_size", "544", "576"]
    refused = ex.state.compare_releases(("0.34.0",))
    assert not refused.ok and "two or more different releases" in refused.text


def test_the_edits_tab_says_what_the_chosen_lmcache_stores():
    """The Explorer's LMCache control and chunk size: the release's verdict,
    its groups and the chunk figure, equal to kvexplore.lmcache_layout's."""
    from kvexplore import lmcache_layout
    from kvexplore.explorer.widgets import Explorer

    ex = Explorer("Qwen/Qwen3.5-0.8B", gpu="H100", lmcache="0.5.6")
    ex.stores_chunk.value = 576
    ex._on_stores()
    expected = lmcache_layout(ex.state.plan, lmcache="0.5.6", chunk_size=576)
    assert ex.state.stores.chunk_bytes == expected.chunk_bytes > 0
    assert f"{expected.chunk_bytes:,} B" in ex.stores_panel.value
    assert ex.stores_figure.value[:4] == b"\x89PNG"
    ex.stores_chunk.value = 0
    ex._on_stores()
    assert "chunk_size=0" in ex.stores_panel.value and ex.state.stores is None
