"""The real hybrid / attention-free configs bundled in ``kvexplore/model_configs``,
each planned once on an H100 at TP 1, against facts read by hand from the
``config.json`` file itself (never from kvexplore's or vLLM's output):

- which decoder layers carry a recurrent state and which an attention KV cache,
  from the config's own layer-pattern field (``hybrid_override_pattern``,
  ``layer_types``, ``linear_attn_config``) or, for pure Mamba, from
  ``num_hidden_layers``;
- the attention layers' KV heads and head size (``num_key_value_heads`` and
  ``head_dim``; MLA: one latent head of ``kv_lora_rank + qk_rope_head_dim``);
- the element count of each recurrent state, by the mixer family's formula;
- one layer name exactly as vLLM registers it.  The names come from reading
  the model classes of the installed vLLM (site-packages ``vllm/...``):

  * ``model_executor/models/mamba.py``: ``MambaForCausalLM`` builds its model
    under ``backbone`` and each mixer at ``{prefix}.mixer``:
    ``backbone.layers.{i}.mixer``;
  * ``model_executor/models/nemotron_h.py``: Mamba mixers at
    ``model.layers.{i}.mixer``, attention at ``model.layers.{i}.mixer.attn``;
  * ``model_executor/models/qwen3_5.py`` (+ ``qwen3_next.py``): the language
    model under ``language_model``, GDN at ``...layers.{i}.linear_attn`` and
    attention at ``...layers.{i}.self_attn.attn``; ``minicpmv4_6.py`` builds a
    ``Qwen3_5ForCausalLM`` at ``language_model``;
  * ``models/kimi_k3/nvidia/model.py`` (``KimiLinearForCausalLM``): KDA and MLA
    both at ``model.layers.{i}.self_attn`` (``MultiHeadLatentAttention`` is
    itself the attention layer), KDA where ``layer_idx + 1`` is listed in
    ``linear_attn_config["kda_layers"]`` (``configs/kimi_linear.py: is_kda_layer``);
  * ``model_executor/models/llama_eagle.py``: EAGLE layers are named
    ``model.layers.{i + target num_hidden_layers}``;
    ``v1/worker/gpu/spec_decode/standalone_ar/speculator.py``: a draft model is
    built under the prefix ``draft_model``.

One plan per model (module cache); every test can fail, none skips.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch

import kvexplore

CATALOG = Path(kvexplore.__file__).resolve().parent / "model_configs"
GPU = "H100"


def _file(name: str) -> Path:
    return CATALOG / (name.replace("/", "--", 1) + ".json")


@functools.cache
def raw(name: str) -> dict:
    """The bundled config.json, parsed with Python's json (nothing else)."""
    return json.loads(_file(name).read_text())


@functools.cache
def planned(name: str):
    return kvexplore.plan(name, gpu=GPU)


@functools.cache
def planned_with(target: str, spec_json: str):
    return kvexplore.plan(target, gpu=GPU, speculative_config=json.loads(spec_json))


def _by_kind(p) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for info in p.layers:
        out.setdefault(info.kind, []).append(info.name)
    return out


def _attention_spec_matches(p, names, kv_heads: int, head_size: int) -> None:
    for n in names:
        spec = p.layer_specs[n]
        assert (spec.num_kv_heads, spec.head_size) == (kv_heads, head_size), n


def _state_elements(p, names) -> set[tuple[int, ...]]:
    return {tuple(math.prod(s) for s in p.layer_specs[n].shapes) for n in names}


NEW_CONFIGS = [
    "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "tiiuae/falcon-mamba-7b",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "InternScience/Agents-A1",
    "openbmb/MiniCPM-V-4.6",
    "meta-llama/Llama-3.2-1B-Instruct",
    "yuhuili/EAGLE-LLaMA3-Instruct-8B",
]


@pytest.mark.parametrize("name", NEW_CONFIGS)
def test_bundled_and_listed(name):
    assert _file(name).is_file()
    assert name in kvexplore.catalog_names()
    sources = (CATALOG / "SOURCES.md").read_text()
    assert f"## {name.replace('/', '--', 1)}.json" in sources, "SOURCES.md entry"


# --- Kimi-Linear: KDA (recurrent) + MLA --------------------------------------


def test_kimi_linear_kda_and_mla_layers():
    c = raw("moonshotai/Kimi-Linear-48B-A3B-Instruct")
    lac = c["linear_attn_config"]
    kda = [i - 1 for i in lac["kda_layers"]]  # 1-based in the config
    mla = [i - 1 for i in lac["full_attn_layers"]]
    assert sorted(kda + mla) == list(range(c["num_hidden_layers"]))  # 27 layers
    p = planned("moonshotai/Kimi-Linear-48B-A3B-Instruct")
    kinds = _by_kind(p)
    assert set(kinds) == {"mamba", "mla_attention"}
    assert kinds["mamba"] == [f"model.layers.{i}.self_attn" for i in kda]  # 20
    assert kinds["mla_attention"] == [f"model.layers.{i}.self_attn" for i in mla]  # 7
    assert "model.layers.3.self_attn" in kinds["mla_attention"]  # full_attn_layers[0] == 4
    # MLA caches one latent "head" of kv_lora_rank + qk_rope_head_dim = 512 + 64
    _attention_spec_matches(p, kinds["mla_attention"], 1, c["kv_lora_rank"] + c["qk_rope_head_dim"])
    # KDA: q, k and v each have a short conv of kernel-1 steps over heads*head_dim
    # channels; the recurrent state is one head_dim x head_dim matrix per head
    h, d, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    assert _state_elements(p, kinds["mamba"]) == {((k - 1) * 3 * h * d, h * d * d)}


# --- Falcon-Mamba: attention-free Mamba-1 -------------------------------------


def test_falcon_mamba_is_all_mamba1():
    c = raw("tiiuae/falcon-mamba-7b")
    p = planned("tiiuae/falcon-mamba-7b")
    kinds = _by_kind(p)
    assert set(kinds) == {"mamba"}
    assert kinds["mamba"] == [f"backbone.layers.{i}.mixer" for i in range(c["num_hidden_layers"])]
    # Mamba-1 over intermediate_size channels (the file's 8192, not expand *
    # hidden_size): conv state (conv_kernel - 1) steps, SSM state state_size each
    inner = c["intermediate_size"]
    assert _state_elements(p, kinds["mamba"]) == {
        ((c["conv_kernel"] - 1) * inner, inner * c["state_size"])}
    assert p.kv_cache_config.kv_cache_groups, "a Mamba group exists"


# --- Nemotron-3 Nano: Mamba-2 + attention + MoE ("E", no cache) ---------------


def test_nemotron3_nano_pattern():
    c = raw("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    pattern = c["hybrid_override_pattern"]
    assert len(pattern) == c["num_hidden_layers"] == 52
    mamba = [i for i, ch in enumerate(pattern) if ch == "M"]
    attn = [i for i, ch in enumerate(pattern) if ch == "*"]
    assert (len(mamba), len(attn)) == (23, 6)
    p = planned("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    kinds = _by_kind(p)
    assert set(kinds) == {"mamba", "full_attention"}  # "E" (MoE) layers hold no cache
    assert kinds["mamba"] == [f"model.layers.{i}.mixer" for i in mamba]
    assert kinds["full_attention"] == [f"model.layers.{i}.mixer.attn" for i in attn]
    assert "model.layers.5.mixer.attn" in p.layer_specs  # first "*" is pattern[5]
    _attention_spec_matches(p, kinds["full_attention"], c["num_key_value_heads"], c["head_dim"])
    # Mamba-2: conv over inner + 2 * n_groups * ssm_state_size channels,
    # SSM state heads x head_dim x state; inner = mamba_num_heads * mamba_head_dim
    heads, hd, g, n = c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"], c["ssm_state_size"]
    conv = (c["conv_kernel"] - 1) * (heads * hd + 2 * g * n)
    assert _state_elements(p, kinds["mamba"]) == {(conv, heads * hd * n)}
    # "mamba_ssm_cache_dtype": "float32" reaches the SSM state; conv keeps bf16
    spec = p.layer_specs[kinds["mamba"][0]]
    assert spec.dtypes == (torch.bfloat16, torch.float32)


# --- Qwen3.5 MoE (InternScience/Agents-A1) and MiniCPM-V 4.6: GDN + attention --


def _gdn_conv_state(t: dict) -> tuple[int, int]:
    k, v = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    conv = (t["linear_conv_kernel_dim"] - 1) * (2 * k * dk + v * dv)
    return conv, v * dk * dv


@pytest.mark.parametrize("name, n_linear, n_full", [
    ("InternScience/Agents-A1", 30, 10),
    ("openbmb/MiniCPM-V-4.6", 18, 6),
])
def test_qwen35_family_layer_types(name, n_linear, n_full):
    t = raw(name)["text_config"]
    types = t["layer_types"]
    assert len(types) == t["num_hidden_layers"]
    linear = [i for i, x in enumerate(types) if x == "linear_attention"]
    full = [i for i, x in enumerate(types) if x == "full_attention"]
    assert (len(linear), len(full)) == (n_linear, n_full)
    p = planned(name)
    kinds = _by_kind(p)
    assert set(kinds) == {"mamba", "full_attention"}
    assert kinds["mamba"] == [f"language_model.model.layers.{i}.linear_attn" for i in linear]
    assert kinds["full_attention"] == [
        f"language_model.model.layers.{i}.self_attn.attn" for i in full]
    assert "language_model.model.layers.3.self_attn.attn" in p.layer_specs
    _attention_spec_matches(p, kinds["full_attention"], t["num_key_value_heads"], t["head_dim"])
    assert _state_elements(p, kinds["mamba"]) == {_gdn_conv_state(t)}


def test_agents_a1_ssm_state_follows_mamba_ssm_dtype():
    """``text_config.mamba_ssm_dtype: float32`` is applied by vLLM's
    ``Qwen3_5ForConditionalGenerationConfig`` hook; the conv state keeps the
    model dtype (``dtype: bfloat16``)."""
    t = raw("InternScience/Agents-A1")["text_config"]
    assert (t["mamba_ssm_dtype"], t["dtype"]) == ("float32", "bfloat16")
    p = planned("InternScience/Agents-A1")
    spec = p.layer_specs["language_model.model.layers.0.linear_attn"]
    assert spec.dtypes == (torch.bfloat16, torch.float32)


# --- draft models for the bundled Llama-3.1-8B-Instruct ------------------------

TARGET = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.2-1B-Instruct",
                                  "yuhuili/EAGLE-LLaMA3-Instruct-8B"])
def test_draft_configs_plan_alone(name):
    c = raw(name)
    p = planned(name)
    kinds = _by_kind(p)
    assert kinds == {"full_attention": [f"model.layers.{i}.self_attn.attn"
                                        for i in range(c["num_hidden_layers"])]}
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    _attention_spec_matches(p, kinds["full_attention"], c["num_key_value_heads"], head)


def test_eagle_head_adds_one_draft_layer_after_the_target():
    head = raw("yuhuili/EAGLE-LLaMA3-Instruct-8B")
    target = raw(TARGET)
    assert head["num_hidden_layers"] == 1 and head["hidden_size"] == target["hidden_size"]
    spec = {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
            "num_speculative_tokens": 3}
    p = planned_with(TARGET, json.dumps(spec))
    name = f"model.layers.{target['num_hidden_layers']}.self_attn.attn"  # layers.32
    assert p.drafter is not None and p.drafter.layer_names == (name,)
    _attention_spec_matches(p, [name], head["num_key_value_heads"],
                            head["hidden_size"] // head["num_attention_heads"])
    assert len(p.layers) == target["num_hidden_layers"] + 1


def test_llama32_1b_as_draft_model():
    draft = raw("meta-llama/Llama-3.2-1B-Instruct")
    spec = {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct",
            "num_speculative_tokens": 3}
    p = planned_with(TARGET, json.dumps(spec))
    names = tuple(f"draft_model.model.layers.{i}.self_attn.attn"
                  for i in range(draft["num_hidden_layers"]))
    assert p.drafter is not None and p.drafter.layer_names == names
    _attention_spec_matches(p, names, draft["num_key_value_heads"], draft["head_dim"])
