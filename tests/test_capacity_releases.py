"""capacity() answers on every release of the window with that release's own
pool arithmetic.

These tests run in each release's environment.  The oracle is the release's
engine-core sequence called here directly on the plan's KV cache specs:
``get_kv_cache_configs`` (imported from ``vllm/v1/core/kv_cache_planning.py``
where the release has it, else ``vllm/v1/core/kv_cache_utils.py``),
``generate_scheduler_kv_cache_config`` and ``update_kv_cache_capacity``, the
function that prints ``GPU KV cache size: N tokens`` and ``Maximum
concurrency``; and a count by hand from a dense model's ``config.json``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import kvexplore
from kvexplore.planning.emulation import emulate

pytestmark = pytest.mark.release

DENSE = "meta-llama/Llama-3.2-1B-Instruct"
MAMBA_HYBRID = "ibm-granite/granite-4.0-h-350m"
GDN_HYBRID = "Qwen/Qwen3.5-0.8B"
MODELS = (DENSE, MAMBA_HYBRID, GDN_HYBRID)
GPUS = ("H100", "A100")
MAX_MODEL_LEN = 32768
CONFIGS = Path(kvexplore.__file__).parent / "model_configs"


def _planning_module():
    try:
        return importlib.import_module("vllm.v1.core.kv_cache_planning")
    except ImportError:
        return importlib.import_module("vllm.v1.core.kv_cache_utils")


def _engine_core(p, memory: int):
    """``(vllm_config, worker KVCacheConfig, scheduler KVCacheConfig)`` of the
    release's engine core for ``memory`` bytes of KV cache on the plan's one
    worker: ``get_kv_cache_configs`` on the plan's spec dict (with the global
    groups where the release groups first), then the scheduler's config and
    ``update_kv_cache_capacity`` as ``EngineCore._initialize_kv_caches`` runs
    them.  A refusal is vLLM's ``ValueError``."""
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        update_kv_cache_capacity,
    )

    vc, specs = p.vllm_config, dict(p.layer_specs)
    vc.cache_config.num_gpu_blocks_override = None
    planning = _planning_module()
    with emulate(p.gpu, meta_tensors=False):
        if hasattr(planning, "get_global_kv_cache_groups"):
            groups = planning.get_global_kv_cache_groups(vc, [specs])
            cfg = planning.get_kv_cache_configs(vc, [specs], [memory], groups)[0]
        else:
            cfg = planning.get_kv_cache_configs(vc, [specs], [memory])[0]
    scheduler = generate_scheduler_kv_cache_config([cfg])
    groups = scheduler.kv_cache_groups
    participating = [
        g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable
    ]
    vc.cache_config.block_size = min(
        participating or [g.kv_cache_spec.block_size for g in groups]
    )
    update_kv_cache_capacity(vc, scheduler)
    return vc, cfg, scheduler


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("model", MODELS)
def test_capacity_is_the_releases_own_sizing(model, gpu):
    """num_blocks, the bytes per block id, ``GPU KV cache size`` (tokens) and
    ``Maximum concurrency`` as the release's engine core computes them for
    the memory capacity() finds."""
    r = kvexplore.capacity(model, gpu=gpu, max_model_len=MAX_MODEL_LEN)
    vc, cfg, scheduler = _engine_core(r.plan, r.kv_cache_memory)
    assert r.num_blocks == cfg.num_blocks == scheduler.num_blocks > 0
    assert r.bytes_per_block == cfg.kv_cache_tensors[0].size // cfg.num_blocks
    assert r.kv_cache_size_tokens == vc.cache_config.kv_cache_size_tokens
    assert r.max_concurrency == pytest.approx(
        vc.cache_config.kv_cache_max_concurrency, rel=1e-12
    )
    assert r.admitted and r.admission_message is None
    # every group blocks alike, so a prefix-cache hit lands on whole blocks
    assert set(r.group_table.block_size) == {r.block_size}
    assert r.cache_hit_alignment == r.block_size
    assert r.prefix_hit_tokens(2 * r.block_size + 1) == 2 * r.block_size
    assert r.plan.vllm_version in r.plan.explain().splitlines()[0]


@pytest.mark.parametrize(
    "model, memory",
    [(DENSE, 256 << 20), (MAMBA_HYBRID, 64 << 20), (GDN_HYBRID, 100 << 20)],
)
def test_a_refusal_is_the_releases_own_message(model, memory):
    """A memory too small for one request of 32,768 tokens: capacity() is
    refused with the release's own ValueError text, and the length that
    text estimates is capacity()'s largest_max_model_len."""
    r = kvexplore.capacity(
        model, gpu="H100", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=memory
    )
    with pytest.raises(ValueError) as err:
        _engine_core(r.plan, memory)
    message = " ".join(str(err.value).split())
    assert not r.admitted
    assert r.admission_message == message
    assert 0 < r.largest_max_model_len < MAX_MODEL_LEN
    assert f"estimated maximum model length is {r.largest_max_model_len}." in message
    # (8 sequences: vLLM's default 1,024 on an H100 is more than these few
    # blocks, which the CUDA-graph check refuses for a hybrid)
    assert kvexplore.capacity(
        model,
        gpu="H100",
        max_model_len=r.largest_max_model_len,
        kv_cache_memory_bytes=memory,
        max_num_seqs=8,
    ).admitted


@pytest.mark.parametrize("gpu", GPUS)
def test_dense_capacity_counted_by_hand(gpu):
    """Llama-3.2-1B: one full-attention group, so a block id costs
    ``layers x 2 (K, V) x block_size x kv_heads x head_dim x 2 B`` (bf16),
    ``num_blocks`` is the KV cache memory over it, the cache holds
    ``num_blocks x block_size`` tokens and ``num_blocks x block_size /
    max_model_len`` requests of ``max_model_len``."""
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.2-1B-Instruct.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert cfg["torch_dtype"] == "bfloat16"
    r = kvexplore.capacity(DENSE, gpu=gpu, max_model_len=MAX_MODEL_LEN)
    bs = r.block_size
    assert MAX_MODEL_LEN % bs == 0
    per_block = (
        cfg["num_hidden_layers"] * 2 * bs * cfg["num_key_value_heads"] * head_dim * 2
    )
    assert r.bytes_per_block == per_block
    assert r.num_blocks == r.kv_cache_memory // per_block
    assert r.kv_cache_size_tokens == r.num_blocks * bs
    assert r.max_concurrency == pytest.approx(
        r.num_blocks * bs / MAX_MODEL_LEN, rel=1e-12
    )
    assert r.blocks_per_request == MAX_MODEL_LEN // bs
    # a request of the model's whole length fits with this much memory
    assert r.largest_max_model_len == cfg["max_position_embeddings"]


@pytest.mark.parametrize("gpu", GPUS)
def test_an_attention_free_model_blocks_as_the_engine_core_sets_it(gpu):
    """mamba-130m (one Mamba group, no attention, no prefix caching): its one
    group blocks at another size than the configured block size, and the
    engine core sets the scheduler's block size to the group's before the
    coordinator is built (whose check, on 0.31.0, asserts that it divides);
    capacity() answers on every release with that block size and the engine
    core's tokens and concurrency."""
    r = kvexplore.capacity("state-spaces/mamba-130m-hf", gpu=gpu, max_model_len=MAX_MODEL_LEN)
    vc, cfg, scheduler = _engine_core(r.plan, r.kv_cache_memory)
    (group,) = r.plan.kv_cache_config.kv_cache_groups
    mamba_block = group.kv_cache_spec.block_size
    assert mamba_block != r.plan.vllm_config.cache_config.block_size
    assert r.block_size == vc.cache_config.block_size == mamba_block
    assert r.scheduler_block_size == r.cache_hit_alignment == mamba_block
    assert r.num_blocks == scheduler.num_blocks > 0
    assert r.kv_cache_size_tokens == vc.cache_config.kv_cache_size_tokens
    assert r.max_concurrency == pytest.approx(vc.cache_config.kv_cache_max_concurrency, rel=1e-12)
