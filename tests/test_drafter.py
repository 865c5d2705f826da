"""A speculative deployment's drafter: its layers, as vLLM's speculator builds them.

Facts come from the configs by hand (``mtp_num_hidden_layers``,
``num_nextn_predict_layers``, the draft model's own layer count, heads and
head size), and the grouping from vLLM's own ``get_kv_cache_groups`` called
here on the plan's combined specs.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import pytest
from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

import kvexplore

QWEN = "Qwen/Qwen3.5-0.8B"
MTP = {"method": "mtp", "num_speculative_tokens": 3}

#: A small Llama draft model given as its own config (a dict, as plan()'s model).
SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "rope_theta": 500000.0,
}


def config_of(name: str) -> dict:
    file = name.replace("/", "--") + ".json"
    return json.loads(resources.files("kvexplore.model_configs").joinpath(file).read_text())


@functools.cache
def planned(model, gpu, tp, spec_json):
    spec = json.loads(spec_json) if spec_json else None
    return kvexplore.plan(model, gpu=gpu, tensor_parallel_size=tp, speculative_config=spec)


def grouping_by_vllm(p) -> list[list[str]]:
    """vLLM's own grouping of the plan's layer specs (called directly)."""
    return [list(g.layer_names) for g in get_kv_cache_groups(p.vllm_config, dict(p.layer_specs))]


@pytest.mark.parametrize("gpu", ["A100", "H100"])
@pytest.mark.parametrize("tp", [1, 2])
def test_qwen35_mtp_adds_the_configs_mtp_layers(gpu, tp):
    text = config_of(QWEN)["text_config"]
    p = planned(QWEN, gpu, tp, json.dumps(MTP))
    bare = planned(QWEN, gpu, tp, None)
    drafts = [info for info in p.layers if info.is_draft]
    assert len(drafts) == text["mtp_num_hidden_layers"] == 1
    assert [d.name for d in drafts] == ["mtp.layers.0.self_attn.attn"]
    spec = p.layer_specs[drafts[0].name]
    assert isinstance(spec, FullAttentionSpec) and spec.is_draft
    # heads and head size from the config: 2 KV heads split over TP (at least 1), head_dim 256
    assert spec.num_kv_heads == max(1, text["num_key_value_heads"] // tp)
    assert spec.head_size == text["head_dim"] == 256
    # the target's 24 layers are unchanged, and none of them is a draft layer
    target = [(i.name, i.kind) for i in p.layers if not i.is_draft]
    assert target == [(i.name, i.kind) for i in bare.layers]
    assert len(target) == text["num_hidden_layers"] == 24
    assert not any(i.is_draft for i in bare.layers)
    # the grouping is vLLM's own for the combined specs: the draft layer joins
    # the attention group, 6 + 1 layers
    assert [list(g.layer_names) for g in p.groups] == grouping_by_vllm(p)
    assert sorted(len(g.layer_names) for g in p.groups) == [6, 6, 6, 7]
    assert p.drafter.speculator == "MTPSpeculator"
    assert p.drafter.layer_names == ("mtp.layers.0.self_attn.attn",)
    assert "mtp.layers.0.self_attn.attn" in p.explain()


def test_qwen35_mtp_pages_and_offloading_see_the_draft_layer():
    p = planned(QWEN, "A100", 1, json.dumps(MTP))
    attention = next(g for g in p.groups if g.kind == "full_attention")
    # 7 layers of one page each per block: 7 x block_size x 2,048 B
    assert p.bytes_per_block == 7 * p.block_size * 2048
    result = kvexplore.offload_config(p)
    names = {n for g in result.config.groups for n in g.layer_names}
    assert "mtp.layers.0.self_attn.attn" in names
    assert result.config.worker_kv_bytes_per_block == p.bytes_per_block
    assert attention.layer_names[-1] == "mtp.layers.0.self_attn.attn"
    kv = kvexplore.allocate(p, device="meta")
    assert tuple(kv["mtp.layers.0.self_attn.attn"].shape)[0] == p.num_blocks


def test_deepseek_v3_mtp_adds_one_mla_draft_layer():
    config = config_of("deepseek-ai/DeepSeek-V3")
    p = kvexplore.plan("deepseek-ai/DeepSeek-V3", gpu="H100",
                       speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    drafts = [i for i in p.layers if i.is_draft]
    assert len(drafts) == config["num_nextn_predict_layers"] == 1
    # vLLM names the next-n layer after the 61 target layers
    assert drafts[0].name == f"model.layers.{config['num_hidden_layers']}.self_attn.attn"
    spec = p.layer_specs[drafts[0].name]
    assert isinstance(spec, MLAAttentionSpec)
    assert spec.head_size == config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576
    assert len(p.layers) == config["num_hidden_layers"] + 1
    assert [list(g.layer_names) for g in p.groups] == grouping_by_vllm(p)


def test_a_draft_model_with_its_own_config():
    p = kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", speculative_config={
        "method": "draft_model", "model": SMALL_LLAMA, "num_speculative_tokens": 3})
    llama = config_of("meta-llama/Llama-3.1-8B-Instruct")
    drafts = [i for i in p.layers if i.is_draft]
    assert len(drafts) == SMALL_LLAMA["num_hidden_layers"] == 3
    assert [d.name for d in drafts] == [
        f"draft_model.model.layers.{i}.self_attn.attn" for i in range(3)]
    for d in drafts:
        spec = p.layer_specs[d.name]
        assert (spec.num_kv_heads, spec.head_size) == (4, 64)
    assert len(p.layers) - len(drafts) == llama["num_hidden_layers"] == 32
    assert p.drafter.speculator == "StandaloneARSpeculator"
    assert p.drafter.architecture == "LlamaForCausalLM"
    assert [list(g.layer_names) for g in p.groups] == grouping_by_vllm(p)
    # all full attention: vLLM keeps one group whose specs differ per layer
    # (the draft's 4 KV heads x 64 against the target's 8 x 128)
    (group,) = p.groups
    heads = {(s.num_kv_heads, s.head_size) for s in group.kv_cache_spec.kv_cache_specs.values()}
    assert heads == {(4, 64), (llama["num_key_value_heads"], 128)}


def test_ngram_adds_no_layers_and_says_so():
    p = kvexplore.plan(QWEN, gpu="A100", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    bare = planned(QWEN, "A100", 1, None)
    assert [i.name for i in p.layers] == [i.name for i in bare.layers]
    assert p.drafter.speculator is None and not p.drafter.adds_layers
    assert "no draft model, so no KV cache layers are added" in p.derivation()["drafter"]


@pytest.mark.parametrize("model,spec,expected", [
    (QWEN, {"method": "nosuch", "num_speculative_tokens": 2}, ["'nosuch'", "Input should be"]),
    ("meta-llama/Llama-3.1-8B-Instruct", {"method": "mtp", "num_speculative_tokens": 2},
     ["Unsupported speculative method: 'mtp'", "LlamaForCausalLM"]),
    (QWEN, {"method": "mtp", "num_speculative_tokens": 0},
     ["num_speculative_tokens", "greater than 0"]),
    (QWEN, {"method": "draft_model", "num_speculative_tokens": 2,
            "model": {**SMALL_LLAMA, "architectures": ["NoSuchForCausalLM"]}},
     ["NoSuchForCausalLM"]),
])
def test_bad_speculative_configs_quote_vllm(model, spec, expected):
    with pytest.raises(kvexplore.KVExploreError) as info:
        kvexplore.plan(model, gpu="H100", speculative_config=spec)
    for text in expected:
        assert text in str(info.value)


def test_an_eagle_head_with_its_own_config():
    head = config_of("yuhuili/EAGLE-LLaMA3-Instruct-8B")
    target = config_of("meta-llama/Llama-3.1-8B-Instruct")
    p = kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", speculative_config={
        "method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
        "num_speculative_tokens": 3})
    drafts = [i for i in p.layers if i.is_draft]
    assert len(drafts) == head["num_hidden_layers"] == 1
    # EAGLE's layer is numbered after the target's decoder layers
    assert drafts[0].name == f"model.layers.{target['num_hidden_layers']}.self_attn.attn"
    spec = p.layer_specs[drafts[0].name]
    assert spec.num_kv_heads == head["num_key_value_heads"]
    assert spec.head_size == head["hidden_size"] // head["num_attention_heads"]
    assert p.drafter.speculator == "EagleSpeculator"
    assert [list(g.layer_names) for g in p.groups] == grouping_by_vllm(p)


def test_maps_explorer_and_compare_show_the_drafter():
    from kvexplore.explorer.state import ExplorerState

    p = planned(QWEN, "A100", 1, json.dumps(MTP))
    position = next(i.index for i in p.layers if i.is_draft)
    assert "(layer position 24, full_attention (draft), group 3" in kvexplore.page_layout(p, position).text()
    buffers = kvexplore.buffer_layout(p)
    assert "D0" in {s.label for row in buffers.rows for s in row.segments}
    state = ExplorerState(QWEN, gpu="A100", speculative_method="mtp", num_speculative_tokens=3)
    assert state.error is None and len(state.plan.layers) == 25
    assert state.plan.inputs["speculative_config"] == MTP
    c = kvexplore.compare({"model": QWEN, "gpu": "A100"}, speculative_method="mtp")
    assert c.row("layers").a == "24" and c.row("layers").b == "25"
    assert c.row("drafter").a == "none" and "MTPSpeculator" in c.row("drafter").b
