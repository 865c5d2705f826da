"""The engine keywords beyond the cache's own: each reaches vLLM's config and
changes the plan as vLLM's own functions (called here directly) or the
model's config, counted by hand, say; bad values are refused naming them."""

import dataclasses

import pytest

import kvexplore
from kvexplore import KVExploreError

LLAMA = "meta-llama/Llama-3.2-1B-Instruct"
MAMBA = "state-spaces/mamba-130m-hf"
QWEN = "Qwen/Qwen3.5-0.8B"
QWEN_NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct"

# Llama-3.2-1B-Instruct's config.json: hidden 2048, 32 heads and 8 KV heads of
# 64, intermediate 8192, vocabulary 128256, tied embeddings, bfloat16
HIDDEN, KV, INTER, VOCAB = 2048, 8 * 64, 8192, 128256
LINEAR_PER_LAYER = ((HIDDEN + 2 * KV) * HIDDEN   # qkv_proj
                    + HIDDEN * HIDDEN             # o_proj
                    + 2 * INTER * HIDDEN          # gate_up_proj
                    + HIDDEN * INTER)             # down_proj
NORMS_PER_LAYER = 2 * HIDDEN


def _llama_bf16_bytes(layers: int) -> int:
    """Parameters of vLLM's LlamaForCausalLM per rank at TP 1, in bfloat16:
    the (tied) embedding, the final norm and each layer's linears and norms."""
    return 2 * (VOCAB * HIDDEN + HIDDEN + layers * (LINEAR_PER_LAYER + NORMS_PER_LAYER))


def _vllm_engine_config(model: str, **engine_kwargs):
    """vLLM's own ``EngineArgs.create_engine_config`` for ``model`` under the
    H100's platform emulation, not through the planner."""
    from vllm.config.logging import LoggingConfig
    from vllm.engine.arg_utils import EngineArgs

    from kvexplore.planning.emulation import emulate
    from kvexplore.planning.gpus import resolve_gpu

    src = kvexplore.load_model_config(model)
    with emulate(resolve_gpu("H100")):
        return EngineArgs(model=str(src.config_dir), skip_tokenizer_init=True,
                          load_format="dummy", logging_config=LoggingConfig(configure_logging=False),
                          **engine_kwargs).create_engine_config()


# -- hf_overrides ------------------------------------------------------------------


@pytest.mark.release
def test_hf_overrides_change_the_config_and_the_layers_vllm_builds():
    p = kvexplore.plan(LLAMA, gpu="H100", num_blocks=16, hf_overrides={"num_hidden_layers": 4})
    assert p.model_config.hf_config.num_hidden_layers == 4
    assert len(p.layers) == 4 == len(p.groups[0].layer_names)
    assert p.weight_bytes == _llama_bf16_bytes(4)
    full = kvexplore.plan(LLAMA, gpu="H100", num_blocks=16)
    assert (len(full.layers), full.weight_bytes) == (16, _llama_bf16_bytes(16))
    assert p.inputs["hf_overrides"] == {"num_hidden_layers": 4}


def test_hf_overrides_refused_unless_a_json_object():
    with pytest.raises(KVExploreError, match=r"hf_overrides=\[4\] is invalid"):
        kvexplore.plan(LLAMA, hf_overrides=[4])


# -- mamba_block_size and mamba_cache_dtype -----------------------------------------


@pytest.mark.release
def test_mamba_block_size_is_the_block_of_an_attention_free_models_state():
    vc = _vllm_engine_config(MAMBA, enable_prefix_caching=True, mamba_block_size=8192)
    p = kvexplore.plan(MAMBA, gpu="H100", num_blocks=16, enable_prefix_caching=True,
                       mamba_block_size=8192)
    assert vc.cache_config.mamba_block_size == 8192
    assert p.cache_config.mamba_block_size == vc.cache_config.mamba_block_size
    assert [g.kv_cache_spec.block_size for g in p.groups] == [8192]


@pytest.mark.release
def test_align_mode_sets_the_mamba_block_to_the_block_size():
    """In align mode vLLM's _align_hybrid_block_size sets mamba_block_size to
    the block size: a requested 8192 does not survive on a hybrid model."""
    p = kvexplore.plan(QWEN, gpu="H100", num_blocks=16, enable_prefix_caching=True,
                       mamba_block_size=8192)
    assert p.mamba_cache_mode == "align"
    assert p.cache_config.mamba_block_size == p.block_size != 8192
    assert {g.kv_cache_spec.block_size for g in p.groups} == {p.block_size}


@pytest.mark.release
def test_mamba_block_size_without_prefix_caching_is_vllms_refusal():
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan(MAMBA, gpu="H100", num_blocks=16, enable_prefix_caching=False,
                       mamba_block_size=8192)
    assert "mamba_block_size=8192" in str(err.value) and "prefix" in str(err.value)


@pytest.mark.release
@pytest.mark.parametrize(("conv", "ssm", "page"), [
    # mamba-130m: intermediate 1536, state 16, conv kernel 4: conv state
    # (3, 1536) and SSM state (1536, 16) elements
    ("float32", "auto", (3 * 1536 + 1536 * 16) * 4),
    ("float16", "auto", (3 * 1536 + 1536 * 16) * 2),
    ("bfloat16", "float32", 3 * 1536 * 2 + 1536 * 16 * 4),
])
def test_mamba_cache_dtype_sets_the_state_page(conv, ssm, page):
    p = kvexplore.plan(MAMBA, gpu="H100", num_blocks=16, mamba_cache_dtype=conv,
                       mamba_ssm_cache_dtype=ssm)
    assert p.mamba_page_size == page
    assert str(p.groups[0].spec.dtypes[0]) == f"torch.{conv}"


# -- prefix_match_unit -------------------------------------------------------------------


@pytest.mark.release
def test_prefix_match_unit_is_the_hash_block_vllm_resolves():
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    p = kvexplore.plan(QWEN, gpu="H100", num_blocks=16, enable_prefix_caching=True,
                       prefix_match_unit=32)
    assert p.prefix_match_unit == 32 and p.block_size % 32 == 0
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(p.kv_cache_config, p.vllm_config)
    assert (scheduler_block, hash_block) == (p.block_size, 32)


@pytest.mark.release
def test_a_prefix_match_unit_that_does_not_divide_the_blocks_is_vllms_refusal():
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan(QWEN, gpu="H100", num_blocks=16, enable_prefix_caching=True,
                       prefix_match_unit=100)
    assert "prefix_match_unit=100" in str(err.value)
    assert "resolve_kv_cache_block_sizes" in str(err.value)


# -- quantization --------------------------------------------------------------------------

FP8_CHECKPOINT = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}


def test_fp8_checkpoint_weights_are_one_byte_per_linear_weight():
    """vLLM's Fp8LinearMethod (quantization/fp8.py) on an fp8 checkpoint: each
    linear weight is float8 (1 byte), with one float32 scale per fused
    partition (qkv 3, o 1, gate_up 2, down 1); each attention layer adds q,
    k, v and probability scales in the model dtype (Fp8KVCacheMethod)."""
    p = kvexplore.plan(LLAMA, gpu="H100", num_blocks=16, quantization="fp8",
                       hf_overrides=FP8_CHECKPOINT)
    assert p.model_config.quantization == "fp8"
    scales_per_layer = (3 + 1 + 2 + 1) * 4 + 4 * 2
    assert p.weight_bytes == _llama_bf16_bytes(16) - 16 * LINEAR_PER_LAYER + 16 * scales_per_layer


def test_online_quantization_is_refused_naming_the_value():
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan(LLAMA, gpu="H100", quantization="fp8")
    assert "quantization='fp8'" in str(err.value) and "online" in str(err.value)


def test_an_unknown_quantization_is_refused_naming_it():
    with pytest.raises(KVExploreError, match="quantization='fp9' is invalid; expected one of"):
        kvexplore.plan(LLAMA, quantization="fp9")


# -- data and expert parallelism -------------------------------------------------------------

# Qwen3-Next-80B-A3B's config.json: 48 layers, each with 512 routed experts of
# intermediate 512 over hidden 2048 (w13: 2 x 512 x 2048, w2: 2048 x 512), bfloat16
ROUTED_EXPERT_BYTES = 48 * 512 * 3 * 512 * 2048 * 2


@pytest.fixture(scope="module")
def qwen_next():
    return kvexplore.plan(QWEN_NEXT, gpu="H100", num_blocks=16)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_data_parallel_halves_the_routed_experts_per_rank(qwen_next, expert_parallel):
    """FusedMoEParallelConfig.make: with DP 2 the MoE layers are sharded (or,
    with expert parallelism, split) over DP x TP = 2 ranks; the rest of the
    model is whole on each rank."""
    p = kvexplore.plan(QWEN_NEXT, gpu="H100", num_blocks=16, data_parallel_size=2,
                       enable_expert_parallel=expert_parallel)
    assert p.parallel_config.data_parallel_size == 2
    assert p.parallel_config.enable_expert_parallel is expert_parallel
    assert p.weight_bytes == qwen_next.weight_bytes - ROUTED_EXPERT_BYTES // 2


def test_expert_parallel_at_tp2_holds_as_many_expert_bytes_as_tp2():
    tp = kvexplore.plan(QWEN_NEXT, gpu="H100", num_blocks=16, tensor_parallel_size=2)
    ep = kvexplore.plan(QWEN_NEXT, gpu="H100", num_blocks=16, tensor_parallel_size=2,
                        enable_expert_parallel=True)
    assert ep.weight_bytes == tp.weight_bytes
    assert [g.kv_cache_spec for g in ep.groups] == [g.kv_cache_spec for g in tp.groups]


@pytest.mark.release
def test_data_parallel_leaves_a_dense_model_whole_on_each_rank():
    one = kvexplore.plan(LLAMA, gpu="H100", num_blocks=16)
    two = kvexplore.plan(LLAMA, gpu="H100", num_blocks=16, data_parallel_size=2)
    assert two.weight_bytes == one.weight_bytes == _llama_bf16_bytes(16)
    assert dataclasses.astuple(two.tensors[0]) == dataclasses.astuple(one.tensors[0])


@pytest.mark.parametrize(("name", "value"), [("data_parallel_size", 0),
                                             ("enable_expert_parallel", "yes")])
def test_bad_parallel_sizes_are_refused_naming_them(name, value):
    with pytest.raises(KVExploreError, match=f"{name}={value!r} is invalid"):
        kvexplore.plan(QWEN_NEXT, **{name: value})


@pytest.mark.release
def test_data_parallel_plans_as_a_process_first_plan():
    """vLLM's init_distributed_environment reads the current config's DP size:
    a process whose first plan has data_parallel_size=2 still plans (one
    process, one rank), and offload_config takes the same deployment."""
    import os
    import subprocess
    import sys

    code = ("import kvexplore\n"
            f"p = kvexplore.plan({LLAMA!r}, gpu='A100', num_blocks=16, data_parallel_size=2)\n"
            "r = kvexplore.offload_config(p, data_parallel_size=2)\n"
            "print(p.parallel_config.data_parallel_size, p.weight_bytes)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(kvexplore.__file__))),
         os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["2", str(_llama_bf16_bytes(16))]
