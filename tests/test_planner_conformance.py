"""The planner's block size and Mamba padding equal the installed vLLM's own alignment.

For every bundled hybrid model x TP {1, 2, 4, 8} x kv_cache_dtype {auto, fp8}
x mamba_cache_mode {align (prefix caching on), none (prefix caching off)} on an
A100, and for every hybrid x every GPU of the table x TP {1, 2} in ``align``
mode, the reference path (:mod:`tests/reference.py`: a fresh ``ModelConfig``,
the model hooks and ``Platform.update_block_size_for_backend`` on a stand-in
config with no built layers, the GDN prefill checkpoint alignment vLLM's
``_resolve_gdn_prefill_backend`` gives on a hand-written platform of the GPU's
compute capability) and ``kvexplore.plan`` must agree, or both must refuse the
configuration.
"""

import itertools

import pytest
from reference import CAPABILITY, qwen35_hand_block_size, vllm_alignment

import kvexplore

pytestmark = pytest.mark.release

#: The KV cache memory every plan here is given: the block size and the
#: Mamba padding come from the model build and the attention backend, never
#: from the cache's size, so no plan runs vLLM's memory profile (the sizing
#: has tests of its own).
CACHE_MEMORY = {"kv_cache_memory_bytes": 64 << 30}

HYBRIDS = [
    "LiquidAI/LFM2-2.6B",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "Qwen/Qwen3.5-0.8B",
    "ai21labs/AI21-Jamba-1.5-Mini",
    "ibm-granite/granite-4.0-h-350m",
    "nvidia/Nemotron-H-56B-Base-8K",
    "tiiuae/Falcon-H1-0.5B-Instruct",
]
CASES = [("A100", *case) for case in itertools.product(
    HYBRIDS, [1, 2, 4, 8], ["auto", "fp8"], [("align", True), ("none", False)])]
GPU_CASES = [(gpu, name, tp, "auto", ("align", True)) for gpu, name, tp in itertools.product(
    sorted(CAPABILITY), [*HYBRIDS, "openbmb/MiniCPM-V-4.6"], [1, 2]) if gpu != "A100"]


def test_every_gpu_of_the_table_is_compared():
    """The GPU table's compute capabilities are NVIDIA's, and every GPU in it
    is among the conformance cases."""
    table = kvexplore.gpus()
    assert {row.gpu: tuple(int(x) for x in row.compute_capability.split("."))
            for row in table.itertuples()} == CAPABILITY
    assert {case[0] for case in CASES + GPU_CASES} == set(table.gpu)


def test_hybrid_coverage():
    archs = {kvexplore.load_model_config(n).architecture for n in HYBRIDS}
    assert {"Qwen3_5ForConditionalGeneration", "Qwen3NextForCausalLM", "NemotronHForCausalLM",
            "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM", "JambaForCausalLM",
            "Lfm2ForCausalLM"} <= archs
    assert len(CASES) >= 100


@pytest.mark.parametrize("gpu, name, tp, kv_dtype, mode", CASES + GPU_CASES)
def test_block_size_matches_vllm(gpu, name, tp, kv_dtype, mode):
    """The reference runs with the backend vLLM selected for the built layers."""
    mamba_mode, prefix = mode
    src = kvexplore.load_model_config(name)
    kwargs = dict(tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
                  enable_prefix_caching=prefix, mamba_cache_mode=mamba_mode)
    try:
        p = kvexplore.plan(src, gpu=gpu, **kwargs, **CACHE_MEMORY)
    except kvexplore.KVExploreError as exc:
        if "is not divisible by" in str(exc):
            # a layer the reference never builds cannot be split over TP
            # (Qwen3.5's vision tower: 12 heads over TP 8)
            assert f"by {tp}" in str(exc)
            return
        with pytest.raises(ValueError):
            vllm_alignment(str(src.config_dir), gpu=gpu, **kwargs)
        return
    ref = vllm_alignment(str(src.config_dir), backend_name=p.attention_backend, gpu=gpu, **kwargs)
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


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"])
@pytest.mark.parametrize("block_size", [None, 64])
def test_backends_match_vllm(backend, block_size):
    src = kvexplore.load_model_config("Qwen/Qwen3.5-0.8B")
    ref = vllm_alignment(str(src.config_dir), backend_name=backend, block_size=block_size)
    p = kvexplore.plan(src, gpu="A100", attention_backend=backend, block_size=block_size,
                       **CACHE_MEMORY)
    assert (p.block_size, p.mamba_page_size_padded) == (ref.block_size, ref.mamba_page_size_padded)


def test_groups_and_tensors_by_hand():
    """Qwen3.5-0.8B by hand: 4 groups of 6 layers; every tensor holds
    64 blocks x one page x 6 layers at offset 0 (vLLM 0.33 on an A100: 1,114,112 B
    pages, 427,819,008 B); layers 64 pages apart."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=64)
    page = qwen35_hand_block_size("A100") * 2048
    cfg = p.kv_cache_config
    assert [len(g.layer_names) for g in cfg.kv_cache_groups] == [6, 6, 6, 6]
    assert len(cfg.kv_cache_tensors) == 4
    for t in cfg.kv_cache_tensors:
        assert t.size == 64 * page * 6
        assert t.layer_stride == 64 * page and t.block_stride == page
    attn = [g for g in cfg.kv_cache_groups if "self_attn" in g.layer_names[0]]
    assert [int(n.split(".")[3]) for n in attn[0].layer_names] == [3, 7, 11, 15, 19, 23]


def test_pure_attention_tokens_by_hand():
    """Llama-3.1-8B: 32 layers x 2 (K,V) x 8 heads x 128 x 2 B = 131,072 B per
    token; 1 GiB holds 8,192 tokens."""
    p = kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="H100",
                       kv_cache_memory_bytes=1 << 30, max_model_len=4096)
    assert p.bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert p.num_blocks * p.block_size == (1 << 30) // (2 * 8 * 128 * 2 * 32)
