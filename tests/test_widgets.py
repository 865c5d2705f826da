"""Explorer logic driven through the widget's controls, no browser."""

import json

import pytest

from kvexplore.explorer.state import PANELS, ExplorerState
from kvexplore.explorer.widgets import Explorer

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
    ex.controls["block"].value = 16
    assert ex.state.error == "block=16 is out of range; expected 0..15 (16 blocks in this plan)"
    ex.controls["block"].value = 0
    assert ex.state.error is None and "linear_attn" in ex.layer_label.value


def test_offload_panel_deterministic(ex):
    text = ex.state.panels["offload"].text
    assert text.startswith("OffloadResult(")
    assert "/tmp/" not in text
    # the OffloadingConfig names the model as vLLM was started with it
    assert "name='Qwen/Qwen3.5-0.8B'" in text or "Qwen/Qwen3.5-0.8B" in text


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
    assert text.startswith("round-trip OK: 24 layers")
    import torch

    # CPU: the first CPU_ROUNDTRIP_BLOCKS blocks; CUDA: every block
    chosen = "all blocks" if torch.cuda.is_available() else "blocks [0, 1]"
    assert chosen in text and "every byte came back" in text
    assert "round-trip OK" in ex.panels["live"].value
    ex.controls["block"].value = 1  # view-only change keeps the result
    assert ex.state.panels["live"].text == text
    ex.controls["registration"].value = "legacy"  # new registration: stale
    assert "not run" in ex.state.panels["live"].text


def test_figure_toggle_draws_png(ex):
    assert ex.figure.layout.display == "none"
    ex.figure_toggle.value = True
    assert ex.figure.value[:4] == b"\x89PNG"
    ex.controls["layer"].value = 99
    assert ex.figure.layout.display == "none"


def test_text_form(ex):
    text = ex.text()
    assert [line for line in text.splitlines() if line.startswith("== ")] == [f"== {n} ==" for n in PANELS]
    assert text == ex.text()
