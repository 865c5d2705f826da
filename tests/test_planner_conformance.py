"""The planner's block size and Mamba padding equal vLLM 0.33's own alignment.

For every bundled hybrid model x TP {1, 2, 4, 8} x kv_cache_dtype {auto, fp8}
x mamba_cache_mode {align (prefix caching on), none (prefix caching off)}, the
reference path (:mod:`kvexplore.reference`: a fresh ``ModelConfig``, the model
hooks and ``Platform.update_block_size_for_backend``) and ``kvexplore.plan``
must agree, or both must refuse the configuration.
"""

import itertools

import pytest

import kvexplore
from kvexplore.reference import vllm_alignment

HYBRIDS = [
    name
    for name in kvexplore.catalog_names()
    if kvexplore.load_model_config(name).model_config().is_hybrid
]
CASES = list(
    itertools.product(HYBRIDS, [1, 2, 4, 8], ["auto", "fp8"], [("align", True), ("none", False)])
)


def test_hybrid_coverage():
    archs = {kvexplore.load_model_config(n).architecture for n in HYBRIDS}
    assert {"Qwen3_5ForConditionalGeneration", "Qwen3NextForCausalLM", "NemotronHForCausalLM",
            "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM", "JambaForCausalLM",
            "Lfm2ForCausalLM"} <= archs
    assert len(CASES) >= 100


@pytest.mark.parametrize("name, tp, kv_dtype, mode", CASES)
def test_block_size_matches_vllm(name, tp, kv_dtype, mode):
    mamba_mode, prefix = mode
    src = kvexplore.load_model_config(name)
    try:
        ref = vllm_alignment(
            str(src.config_dir), tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
            enable_prefix_caching=prefix, mamba_cache_mode=mamba_mode,
        )
    except ValueError as exc:
        with pytest.raises(ValueError):
            kvexplore.plan(src, tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
                           enable_prefix_caching=prefix, mamba_cache_mode=mamba_mode)
        assert str(exc)
        return
    p = kvexplore.plan(src, tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
                       enable_prefix_caching=prefix, mamba_cache_mode=mamba_mode)
    assert p.block_size == ref.block_size
    assert p.mamba_page_size_padded == ref.mamba_page_size_padded
    assert p.mamba_cache_mode == ref.mamba_cache_mode
    assert p.cache_config.mamba_ssm_cache_dtype == ref.mamba_ssm_cache_dtype
    # every page in the plan is the one vLLM padded to (or the attention page)
    pages = {s.page_size_bytes for s in p.layer_specs.values()}
    assert len(pages) == 1
    if ref.mamba_page_size_padded is not None:
        assert pages == {ref.mamba_page_size_padded}
    assert p.block_size * p.attention_page_bytes_per_token == pages.pop()


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN"])
@pytest.mark.parametrize("block_size", [None, 64])
def test_backends_match_vllm(backend, block_size):
    src = kvexplore.load_model_config("Qwen/Qwen3.5-0.8B")
    ref = vllm_alignment(str(src.config_dir), backend_name=backend, block_size=block_size)
    p = kvexplore.plan(src, attention_backend=backend, block_size=block_size)
    assert (p.block_size, p.mamba_page_size_padded) == (ref.block_size, ref.mamba_page_size_padded)


def test_groups_and_tensors_match_vllm_planning():
    """Groups/tensors equal vLLM's get_kv_cache_configs on the same specs."""
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", kv_cache_memory_bytes=4 << 30, max_model_len=8192)
    specs = dict(p.layer_specs)
    groups = get_global_kv_cache_groups(p.vllm_config, [specs])
    cfg = get_kv_cache_configs(p.vllm_config, [specs], [4 << 30], groups)[0]
    assert cfg.kv_cache_groups == p.kv_cache_config.kv_cache_groups
    assert cfg.kv_cache_tensors == p.kv_cache_config.kv_cache_tensors
    assert cfg.num_blocks == p.num_blocks
