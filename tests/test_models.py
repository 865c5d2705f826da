"""Loading model configs from every form users have, and refusing bad ones."""

import json

import pytest
import transformers

import kvexplore
from kvexplore import KVExploreError, load_model_config

QWEN = "Qwen/Qwen3.5-0.8B"


def test_catalog_table():
    df = kvexplore.catalog()
    assert len(df) >= 12
    assert {"model", "architecture", "layers", "kv_heads", "head_size", "state"} <= set(df.columns)
    row = df.set_index("model").loc[QWEN]
    assert row.architecture == "Qwen3_5ForConditionalGeneration"
    assert row.layers == "mamba x18, full_attention x6"
    assert row.state == "GDN_ATTN"
    states = set(df.state)
    assert {"GDN_ATTN", "MAMBA2", "MAMBA1", "SHORT_CONV", ""} <= states
    layer_kinds = " ".join(df.layers)
    for kind in ("mla_attention", "sliding_window", "cross_attention"):
        assert kind in layer_kinds


def test_forms_agree(tmp_path):
    src = load_model_config(QWEN)
    (tmp_path / "config.json").write_text(json.dumps(src.config))
    by_dir = load_model_config(str(tmp_path))
    by_file = load_model_config(str(tmp_path / "config.json"))
    original = json.loads(json.dumps(src.config))
    by_dict = load_model_config(original)
    assert original == src.config  # caller's dict untouched
    for other in (by_dir, by_file, by_dict):
        assert kvexplore.plan(other, gpu="A100").block_size == 544


def test_pretrained_config_form():
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        hidden_size=512, architectures=["LlamaForCausalLM"],
    )
    p = kvexplore.plan(load_model_config(cfg), gpu="A100")
    assert p.block_size == 16
    assert len(p.layer_specs) == 2


def test_unknown_model_lists_close_matches():
    with pytest.raises(KVExploreError) as info:
        load_model_config("Qwen/Qwen3.5-0.8X")
    assert "Qwen/Qwen3.5-0.8B" in str(info.value)


def test_missing_path():
    with pytest.raises(KVExploreError, match="does not exist"):
        load_model_config("./no/such/config.json")


def test_not_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(KVExploreError, match="not valid JSON"):
        load_model_config(str(bad))


def test_mamba_ssm_format_is_refused(request):
    path = request.path.parent / "data" / "state-spaces--mamba2-2.7b.json"
    with pytest.raises(KVExploreError) as info:
        load_model_config(str(path))
    assert "architectures" in str(info.value) and "mamba_ssm" in str(info.value)


def test_missing_field_names_field_and_architecture():
    cfg = json.loads(json.dumps(load_model_config(QWEN).config))
    del cfg["model_type"]
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(cfg, gpu="A100")
    msg = str(info.value)
    assert "model_type" in msg and "Qwen3_5ForConditionalGeneration" in msg


def test_wrong_type_names_field_and_architecture():
    cfg = json.loads(json.dumps(load_model_config(QWEN).config))
    cfg["text_config"]["linear_num_value_heads"] = "sixteen"
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(cfg, gpu="A100")
    msg = str(info.value)
    assert "linear_num_value_heads" in msg and "expected int" in msg
    assert "Qwen3_5ForConditionalGeneration" in msg


def test_unsupported_architecture():
    cfg = {"architectures": ["NoSuchModelForCausalLM"], "model_type": "llama",
           "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    with pytest.raises(KVExploreError, match="NoSuchModelForCausalLM"):
        kvexplore.plan(cfg, gpu="A100")


def test_model_config_carries_the_served_id():
    # vLLM reports the --model id (e.g. in OffloadingConfig.model.name), not a path
    assert kvexplore.plan(QWEN, gpu="A100").model_config.model == QWEN
    cfg = json.loads(json.dumps(load_model_config(QWEN).config))
    assert kvexplore.plan(cfg, gpu="A100").model_config.model != QWEN
