"""What LMCache stores (kvexplore.lmcache_layout), held against facts kvexplore
does not compute: the model configs by hand (layers, KV heads, head size,
state shapes), each release's rules as its source states them (step
alignment, chunk multiples, the negotiated chunk, the last token held back),
and the release's own server cache context (``CPUCacheContext``), run in a
process of its own by ``tests/lmcache_context_oracle.py`` on vLLM's registered
tensors."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import kvexplore
from kvexplore import KVExploreError, allocate, lmcache_layout, lmcache_layouts, plan
from kvexplore.connectors.lmcache_layout import lmcache_package

sys.path.insert(0, os.path.dirname(__file__))
from lmcache_oracle import case_of  # noqa: E402

CONFIGS = Path(kvexplore.__file__).parent / "model_configs"
QWEN = "Qwen/Qwen3.5-0.8B"
NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
CONTEXT_ORACLE = Path(__file__).with_name("lmcache_context_oracle.py")


def _config(name: str) -> dict:
    with open(CONFIGS / (name.replace("/", "--") + ".json")) as f:
        c = json.load(f)
    return c.get("text_config", c)


def _attention_bytes_per_token(name: str, tp: int = 1) -> tuple[int, int]:
    """(attention layers, K+V bytes per token per layer) from the config by hand (bf16)."""
    c = _config(name)
    if "layer_types" in c:
        layers = sum(t == "full_attention" for t in c["layer_types"])
    else:
        layers = c["hybrid_override_pattern"].count("*")
    return layers, 2 * (c["num_key_value_heads"] // tp) * c["head_dim"] * 2


def _mamba_state_bytes(name: str) -> int:
    """One layer's conv + recurrent state, by hand (bf16 conv; fp32 GDN state,
    the state dtype vLLM keeps for Qwen3.5; Nemotron's from its config)."""
    c = _config(name)
    if name == QWEN:
        conv = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                + c["linear_num_value_heads"] * c["linear_value_head_dim"])
        conv *= (c["linear_conv_kernel_dim"] - 1) * 2
        ssm = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4
        return conv + ssm
    d_inner = c["mamba_num_heads"] * c["mamba_head_dim"]
    conv = (d_inner + 2 * c["n_groups"] * c["ssm_state_size"]) * (c["conv_kernel"] - 1) * 2
    ssm = c["mamba_num_heads"] * c["mamba_head_dim"] * c["ssm_state_size"] * 2
    return conv + ssm


@pytest.fixture(scope="module")
def qwen():
    return plan(QWEN, gpu="H100")


@pytest.fixture(scope="module")
def qwen_one_block_steps():
    return plan(QWEN, gpu="H100", max_num_batched_tokens=576)


@pytest.fixture(scope="module")
def nano():
    return plan(NANO, gpu="H100")


# -- the step-alignment rule, per release, as each release's source states it --

@pytest.mark.parametrize("release, steps, ok", [
    # 0.5.2: block_size <= max_num_batched_tokens < 2 * block_size
    ("0.5.2", 8192, False),
    ("0.5.2", 576, True),
    # 0.5.4 and later: max_num_batched_tokens >= block_size
    ("0.5.4", 8192, True),
    ("0.5.6", 8192, True),
    ("0.5.6", 400, False),
])
def test_step_alignment_rule(release, steps, ok, qwen, qwen_one_block_steps):
    p = {8192: qwen, 576: qwen_one_block_steps}.get(steps) or plan(
        QWEN, gpu="H100", max_num_batched_tokens=steps)
    assert p.block_size == 576 and p.vllm_config.scheduler_config.max_num_batched_tokens == steps
    layout = lmcache_layout(p, lmcache=release, chunk_size=576)
    step = next(c for c in layout.checks if c.name == "mamba_step_alignment")
    assert step.ok is ok, step
    if not ok:
        assert layout.refusal == step and not layout.accepted
        assert "max_num_batched_tokens" in step.message and str(steps) in step.message
        assert layout.smallest_chunk() is None
        assert layout.stored(10_000) == 0 and layout.hit(10_000) == 0


def test_registration_refusals_follow_what_vllm_registers(qwen_one_block_steps):
    """LMCache 0.5.2's page view takes a Mamba layer only as a [conv, ssm]
    list; 0.5.4's unified view needs the hint vLLM's get_kv_cache_layout()
    gives, and builds none where the installed vLLM lacks that function."""
    import torch
    from vllm.v1.attention.backends import utils as backend_utils

    p = qwen_one_block_steps
    mamba_layer = p.kv_cache_config.kv_cache_groups[0].layer_names[0]
    registered = allocate(p.with_num_blocks(2), device="cpu")[mamba_layer]
    layout = lmcache_layout(p, lmcache="0.5.2", chunk_size=576)
    if isinstance(registered, torch.Tensor):
        assert layout.refusal.name == "kv_cache_group_edits", layout.checks
        assert "tensor list" in layout.refusal.message
    else:
        assert layout.accepted, layout.refusal
    layout = lmcache_layout(p, lmcache="0.5.4", chunk_size=576)
    if getattr(backend_utils, "get_kv_cache_layout", None) is None:
        assert layout.refusal.name == "kv_cache_group_edits", layout.checks
        assert "kv_layout: None" in layout.refusal.message
    else:
        assert next(c for c in layout.checks if c.name == "layout_hints").ok


# -- the chunk: multiples of every group's block span; negotiated from 0.5.7 --

def test_chunk_rule_and_bytes_by_hand(qwen):
    layers, per_token = _attention_bytes_per_token(QWEN)
    state = _mamba_state_bytes(QWEN)
    page = qwen.kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    assert page == 576 * per_token  # the padded Mamba page fills the attention page

    refused = lmcache_layout(qwen, lmcache="0.5.6", chunk_size=256)
    assert not refused.accepted
    assert refused.refusal.name == "scheduler_chunk"
    assert "multiple of 576" in refused.refusal.message
    assert refused.smallest_chunk() == 576  # lcm of the four groups' 576-token blocks

    for chunk in (576, 1152):
        layout = lmcache_layout(qwen, lmcache="0.5.6", chunk_size=chunk)
        assert layout.accepted, layout.refusal
        assert layout.scheduler_block == 576
        assert layout.group_tokens_per_block == (576,) * 4
        k = layout.kernel_groups
        attention = k[~k.recurrent_state]
        recurrent = k[k.recurrent_state]
        assert len(attention) == 1 and len(recurrent) == 3
        assert int(attention.chunk_bytes.sum()) == layers * chunk * per_token
        # one snapshot per chunk and Mamba layer, whatever the chunk: at
        # least the state, at most the padded page
        per_layer = recurrent.chunk_bytes / recurrent.layer_indices.map(len)
        assert ((per_layer >= state) & (per_layer <= page)).all()
        assert (recurrent.slots_per_chunk == 576).all()
        assert layout.chunk_bytes == int(k.chunk_bytes.sum())
        assert layout.bytes_per_token == pytest.approx(layout.chunk_bytes / chunk)


def test_057_negotiates_the_chunk_up(qwen):
    layout = lmcache_layout(qwen, lmcache="0.5.7rc2", chunk_size=256)
    assert layout.accepted, layout.refusal
    assert layout.negotiated
    assert layout.asked_chunk_size == 256
    assert layout.chunk_size == math.ceil(256 / 576) * 576


def test_nemotron_nano_bytes_and_groups_by_hand(nano):
    layers, per_token = _attention_bytes_per_token(NANO)
    block = nano.block_size
    layout = lmcache_layout(nano, lmcache="0.5.6", chunk_size=block)
    assert layout.accepted, layout.refusal
    assert layout.group_tokens_per_block == tuple(
        g.kv_cache_spec.block_size for g in nano.kv_cache_config.kv_cache_groups)
    e = layout.engine_groups
    assert len(e) == len(nano.kv_cache_config.kv_cache_groups)
    assert e.recurrent_state.sum() == len(e) - 1
    k = layout.kernel_groups
    assert int(k[~k.recurrent_state].chunk_bytes.sum()) == layers * block * per_token
    mamba_layers = _config(NANO)["hybrid_override_pattern"].count("M")
    assert int(k[k.recurrent_state].layer_indices.map(len).sum()) == mamba_layers
    per_layer = k[k.recurrent_state].chunk_bytes / k[k.recurrent_state].layer_indices.map(len)
    assert (per_layer >= _mamba_state_bytes(NANO)).all()


def test_bytes_equal_the_release_cache_context(qwen):
    """kvexplore's bytes per kernel group equal what the release's own CUDA
    cache context transfers per chunk (its ``_TempGPUBuffer``, on the kernel
    groups its CPUCacheContext built from the same registration), and so the
    bytes per token it reports; its
    CPU staging holds the whole chunk: every block, where a recurrent group
    stores one snapshot."""
    release = "0.5.6"
    layout = lmcache_layout(qwen, lmcache=release, chunk_size=1152)
    small = qwen.with_num_blocks(4)
    case = case_of(small.kv_cache_config, small.vllm_config.cache_config,
                   allocate(small, device="cpu"))
    case.update(chunk_size=1152, hints={"kv_layout": "NHD"}, separate_object_groups=False)
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    case_path, out_path = folder / f"ctx-{os.getpid()}.pkl", folder / f"ctx-{os.getpid()}.out"
    with open(case_path, "wb") as f:
        pickle.dump(case, f)
    try:
        done = subprocess.run([sys.executable, str(CONTEXT_ORACLE), str(lmcache_package(release)),
                               str(case_path), str(out_path)], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(out_path, "rb") as f:
            oracle = pickle.load(f)
    finally:
        for path in (case_path, out_path):
            path.unlink(missing_ok=True)
    k = layout.kernel_groups
    assert list(k.chunk_bytes) == oracle["gpu_transfer"]
    blocks = 1152 // 576
    for row, staged in zip(k.to_dict("records"), oracle["cpu_staging"], strict=True):
        assert staged == row["chunk_bytes"] * (blocks if row["recurrent_state"] else 1)
    assert sum(oracle["cpu_staging"]) == oracle["tmp_chunk_bytes"]
    assert layout.chunk_bytes // 1152 == oracle["cache_size_per_token"]


# -- stored and hit: whole chunks; the last token held back from 0.5.6 in align mode --

def test_stored_and_hit_by_hand(nano):
    block = nano.block_size
    assert nano.vllm_config.cache_config.mamba_cache_mode == "align"
    old = lmcache_layout(nano, lmcache="0.5.5", chunk_size=block)
    new = lmcache_layout(nano, lmcache="0.5.6", chunk_size=block)
    assert old.accepted and new.accepted
    assert not old.reserve_last_token and new.reserve_last_token
    for prompt in (0, block - 1, block, block + 1, 3 * block, 3 * block + 7):
        whole = prompt // block * block
        assert old.stored(prompt) == new.stored(prompt) == whole
        assert old.hit(prompt) == whole
        assert new.hit(prompt) == max(0, prompt - 1) // block * block
    text = new.text()
    assert "accepted" in text and f"{new.chunk_bytes:,}" in text
    assert "<table" in new._repr_html_()
    fig = new.figure()
    assert len(fig.axes[0].patches) == len(nano.kv_cache_config.kv_cache_groups) + len(
        new.kernel_groups)


# -- bad input --

@pytest.mark.parametrize("kwargs, match", [
    ({"chunk_size": 0}, "chunk_size=0 is not positive"),
    ({"chunk_size": -256}, "not positive"),
    ({"chunk_size": 256.0}, "is a float"),
    ({"chunk_size": True}, "is a bool"),
    ({"chunk_size": "256"}, "is a str"),
    ({"lmcache": "0.3.0"}, "not a release kvexplore knows"),
    ({"lmcache": "0.4.7"}, "builds no groups from vLLM's KV cache groups"),
    ({"lmcache": "0.5.0"}, "expected one of 0.5.1, 0.5.2"),
    ({"engine_type": "fast"}, "engine_type='fast'"),
    ({"separate_object_groups": "yes"}, "separate_object_groups='yes'"),
])
def test_bad_input_is_one_error(kwargs, match, qwen):
    with pytest.raises(KVExploreError, match=match):
        lmcache_layout(qwen, **kwargs)


def test_another_connector_is_refused():
    p = plan(QWEN, gpu="H100", kv_transfer_config={
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both"})
    with pytest.raises(KVExploreError, match="LMCacheMPConnector"):
        lmcache_layout(p, lmcache="0.5.6")


def test_plan_keywords_with_a_plan_are_refused(qwen):
    with pytest.raises(KVExploreError, match="given with a Plan"):
        lmcache_layout(qwen, gpu="A100")


def test_prompt_tokens_must_be_a_count(nano):
    layout = lmcache_layout(nano, lmcache="0.5.6", chunk_size=nano.block_size)
    for bad in (-1, 2.5, None):
        with pytest.raises(KVExploreError, match="prompt_tokens"):
            layout.hit(bad)


def test_large_steps_without_separate_object_groups_are_warned(qwen):
    """8,192-token steps advance 14 blocks of 576 tokens: said when every
    group shares one object group, not when the server separates them (and
    then the recurrent groups get an object group of their own)."""
    steps = qwen.vllm_config.scheduler_config.max_num_batched_tokens
    assert steps >= 2 * 576
    shared = lmcache_layout(qwen, lmcache="0.5.6", chunk_size=576)
    assert shared.accepted and not shared.separate_object_groups
    assert len(shared.object_groups) == 1
    assert any("--separate-object-groups" in w for w in shared.warnings)
    separate = lmcache_layout(qwen, lmcache="0.5.6", chunk_size=576, separate_object_groups=True)
    assert separate.accepted and separate.warnings == ()
    assert "--separate-object-groups" in separate.server_flags()
    kinds = {bool(r) for r in separate.object_groups.recurrent}
    assert kinds == {True, False}
    # what one chunk stores does not depend on how groups are bucketed
    assert separate.chunk_bytes == shared.chunk_bytes


def test_the_command_line_mirrors_the_api(capsys, nano):
    from kvexplore import cli

    block = nano.block_size
    assert cli.main(["lmcache", NANO, "--gpu", "H100", "--lmcache", "0.5.6", "--chunk-size",
                     str(block), "--prompt-tokens", f"{block},{2 * block + 1}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    api = lmcache_layout(nano, lmcache="0.5.6", chunk_size=block)
    assert out["accepted"] is True and out["chunk_bytes"] == api.chunk_bytes
    assert [r["chunk_bytes"] for r in out["kernel_groups"]] == list(api.kernel_groups.chunk_bytes)
    assert out["prompts"][str(2 * block + 1)] == {"stored": 2 * block, "hit": 2 * block}
    assert out["prompts"][str(block)] == {"stored": block, "hit": 0}
    assert cli.main(["lmcache", NANO, "--chunk-size", "0"]) == 2
    assert "chunk_size=0" in capsys.readouterr().err


def test_the_matrix_says_what_the_server_accepts_per_release_pair(nano):
    """compatibility(chunk_size=...) carries lmcache_layout's verdict per
    (vLLM, LMCache) pair, each in its vLLM release's own process: vLLM 0.34
    gives Nemotron-3-Nano another block size, so a chunk of 0.33's block is
    refused there by 0.5.6 and negotiated up by 0.5.7rc2."""
    from kvexplore.versions.matrix import compatibility

    block = nano.block_size
    c = compatibility(NANO, gpu="H100", vllm=[nano.vllm_version, "0.34.0"],
                      lmcache=["0.5.2", "0.5.6", "0.5.7rc2"], chunk_size=block)
    here = lmcache_layouts(nano, lmcache=["0.5.2", "0.5.6", "0.5.7rc2"], chunk_size=block)
    for version, layout in here.items():
        store = c.stores[(nano.vllm_version, version)]
        assert store["accepted"] == layout.accepted
        assert store["chunk_bytes"] == layout.chunk_bytes
    assert c.stores[(nano.vllm_version, "0.5.6")]["smallest_chunk"] == block
    other = c.stores[("0.34.0", "0.5.6")]
    if other["accepted"]:  # the same block on 0.34: the same answer
        assert other["smallest_chunk"] == block
    else:
        assert other["refused_by"] == "scheduler_chunk"
        assert block % other["smallest_chunk"] != 0 and other["smallest_chunk"] % 16 == 0
        negotiated = c.stores[("0.34.0", "0.5.7rc2")]
        assert negotiated["accepted"] and negotiated["chunk_size"] == other["smallest_chunk"]
    grid = c.grid()
    assert f"stores at chunk {block}" in grid and "<table" in c._repr_html_()
    with pytest.raises(KVExploreError, match="chunk_size=0"):
        compatibility(NANO, gpu="H100", lmcache=["0.5.6"], chunk_size=0)


def test_tensor_parallel_halves_what_a_rank_stores_by_hand():
    """granite-4.0-h-350m on 2 x L40S: each rank registers half the KV heads,
    so one chunk of its attention group stores 4 layers x C x 2 (K, V) x
    (4 KV heads / 2) x head size 64 x 2 bytes."""
    c = _config("ibm-granite/granite-4.0-h-350m")
    p = plan("ibm-granite/granite-4.0-h-350m", gpu="L40S", tensor_parallel_size=2)
    block = p.block_size
    layout = lmcache_layout(p, lmcache="0.5.6", chunk_size=block)
    assert layout.accepted, layout.refusal
    head = c["hidden_size"] // c["num_attention_heads"]
    layers = c["layer_types"].count("attention")
    k = layout.kernel_groups
    assert int(k[~k.recurrent_state].chunk_bytes.sum()) == (
        layers * block * 2 * (c["num_key_value_heads"] // 2) * head * 2)
    assert int(k[k.recurrent_state].layer_indices.map(len).sum()) == c["layer_types"].count("mamba")
