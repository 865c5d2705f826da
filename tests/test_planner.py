"""The planner against Qwen3.5-0.8B counted by hand from its config, and vLLM's objects."""

import dataclasses

import pytest
import torch

import kvexplore
from kvexplore import KVExploreError, plan

QWEN = "Qwen/Qwen3.5-0.8B"


def test_worked_example_tp1():
    p = plan(QWEN, num_blocks=64, gpu="A100")
    assert p.block_size == 544
    assert p.attention_page_bytes_per_token == 2048
    assert p.mamba_page_size == 1_085_440
    assert p.mamba_page_size_padded == 1_114_112
    assert round(100 * (p.mamba_page_size_padded - p.mamba_page_size) / p.mamba_page_size, 2) == 2.64
    kinds = p.group_table.kind.value_counts().to_dict()
    assert kinds == {"mamba": 3, "full_attention": 1}
    assert (p.group_table.layers == 6).all()
    assert p.derivation()["block_size"].startswith("544 = 16 x cdiv(1085440, 16 x 2048)  (A100: ")
    # the Qwen3.5 hook lifts HF mamba_ssm_dtype into the cache config
    assert p.cache_config.mamba_ssm_cache_dtype == "float32"


def test_worked_example_tensors():
    p = plan(QWEN, num_blocks=64, gpu="A100")
    tensors = p.kv_cache_config.kv_cache_tensors
    assert len(tensors) == 4
    assert {t.size for t in tensors} == {427_819_008}
    assert {t.offset for t in tensors} == {0}
    assert {t.layer_stride for t in tensors} == {71_303_168}
    assert {t.block_stride for t in tensors} == {1_114_112}


def test_kernel_block_depends_on_backend():
    # FLASHINFER advertises [16, 32, 64]: 32 is the largest dividing 544
    fi = plan(QWEN, attention_backend="FLASHINFER", gpu="A100")
    attn = [g for g, k in zip(fi.kernel_block_sizes, fi.group_table.kind, strict=True) if k == "full_attention"]
    assert attn == [32] and 544 // 32 == 17
    # FLASH_ATTN advertises MultipleOf(16): the 544-token block runs unsplit
    fa = plan(QWEN, gpu="A100")
    assert set(fa.kernel_block_sizes) == {544}


def test_tp4_gives_272():
    p = plan(QWEN, tensor_parallel_size=4, gpu="A100")
    assert p.block_size == 272
    spec = next(s for s in p.layer_specs.values() if hasattr(s, "num_kv_heads"))
    assert spec.num_kv_heads == 1


def test_without_hook_the_answer_would_be_288():
    # A bf16 SSM state halves the state page: block 288 instead of the fp32 544.
    p = plan(QWEN, mamba_ssm_cache_dtype="bfloat16", gpu="A100")
    assert p.block_size == 288


def test_unified_registration_shapes():
    p = plan(QWEN, num_blocks=64, attention_backend="FLASHINFER", gpu="A100")
    kv = kvexplore.allocate(p)
    gdn = kv["language_model.model.layers.0.linear_attn"]
    assert tuple(gdn.shape) == (64, 1, 1, 1_085_440) and gdn.dtype == torch.int8
    assert gdn.stride() == (1_114_112, 1_085_440, 1_085_440, 1)
    attn = kv["language_model.model.layers.3.self_attn.attn"]
    assert tuple(attn.shape) == (1088, 2, 32, 512) and attn.dtype == torch.bfloat16
    assert attn.stride() == (32768, 512, 1024, 1)
    # all layers view one backing allocation
    ptrs = {t.untyped_storage().data_ptr() for t in kv.values()}
    assert len(ptrs) == 1


def test_legacy_registration_shapes():
    p = plan(QWEN, num_blocks=8, attention_backend="FLASHINFER", gpu="A100")
    kv = kvexplore.allocate(p, registration="legacy")
    conv, ssm = kv["language_model.model.layers.0.linear_attn"]
    assert conv.storage_offset() == 0
    assert conv.stride(0) * conv.element_size() == 1_114_112
    assert ssm.stride(0) * ssm.element_size() == 1_114_112
    conv_bytes = conv[0].numel() * conv.element_size()
    assert conv_bytes == 36_864
    assert ssm.storage_offset() * ssm.element_size() == conv_bytes
    assert ssm.dtype == torch.float32
    attn = kv["language_model.model.layers.3.self_attn.attn"]
    assert tuple(attn.shape) == (8 * 17, 2, 32, 2, 256) and attn.is_contiguous()


def test_plan_is_frozen_and_replace_makes_a_new_plan():
    p = plan(QWEN, gpu="A100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.kernel_block_sizes = (1,)
    q = p.replace(tensor_parallel_size=2)
    assert q.parallel_config.tensor_parallel_size == 2
    assert p.parallel_config.tensor_parallel_size == 1
    assert plan(QWEN, gpu="A100") is p  # cached by inputs


def test_memory_budget_gives_num_blocks():
    p = plan(QWEN, kv_cache_memory_bytes=8 << 30, max_model_len=4096, gpu="A100")
    # by hand from the config: a block id costs one 1,114,112-byte page in each
    # of the 6 layers of a group's tensor: 6,684,672 B; 8 GiB // 6,684,672 = 1285
    assert p.bytes_per_block == 6_684_672
    assert p.num_blocks == 1285
    assert p.tokens_per_gib == 160 * 544  # 1 GiB // 6,684,672 = 160 blocks


def test_specs_are_vllm_objects():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec

    p = plan(QWEN, gpu="A100")
    assert isinstance(p.kv_cache_config, KVCacheConfig)
    kinds = {type(s) for s in p.layer_specs.values()}
    assert kinds == {FullAttentionSpec, MambaSpec}


def test_fp8_halves_attention_page():
    auto = plan(QWEN, gpu="A100")
    fp8 = plan(QWEN, kv_cache_dtype="fp8", gpu="A100")
    assert fp8.attention_page_bytes_per_token * 2 == auto.attention_page_bytes_per_token


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(tensor_parallel_size=3), "divisible by tensor parallel size (3)"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size=0"),
        (dict(block_size=-16), "block_size=-16"),
        (dict(num_blocks=0), "num_blocks=0"),
        (dict(kv_cache_memory_bytes=-1), "kv_cache_memory_bytes=-1"),
        (dict(dtype="float64x"), "dtype='float64x'"),
        (dict(kv_cache_dtype="int3"), "kv_cache_dtype='int3'"),
        (dict(attention_backend="NOPE"), "attention_backend 'NOPE'"),
        (dict(mamba_cache_mode="sometimes"), "mamba_cache_mode='sometimes'"),
        (dict(kv_cache_layout="XYZ"), "kv_cache_layout='XYZ'"),
        (dict(num_blocks=4, kv_cache_memory_bytes=1 << 30), "not both"),
    ],
)
def test_bad_input_is_a_clear_value_error(kwargs, needle):
    with pytest.raises(ValueError) as info:
        plan(QWEN, **kwargs, gpu="A100")
    assert needle in str(info.value)
    assert isinstance(info.value, KVExploreError)


def test_block_size_the_backend_rejects():
    """vLLM's selector refuses every backend for a 24-token block on an A100."""
    with pytest.raises(KVExploreError, match="block_size=24.*block_size not supported"):
        plan("meta-llama/Llama-3.1-8B-Instruct", block_size=24, gpu="A100")


def test_memory_budget_too_small_is_vllms_refusal():
    p = plan(QWEN, kv_cache_memory_bytes=1 << 30, gpu="A100")
    assert not p.admission.ok
    assert p.admission.available_bytes < p.admission.needed_bytes
    assert "max seq len (262144)" in p.admission.message


def test_catalog_plans_every_model():
    names = kvexplore.catalog_names()
    assert len(names) >= 12
    for name in names:
        p = plan(name, gpu="A100")
        assert p.block_size > 0 and p.kv_cache_config.kv_cache_groups
        for gid, kb in enumerate(p.kernel_block_sizes):
            assert p.groups[gid].kv_cache_spec.block_size % kb == 0
        # every derived table renders (capacity reads each spec's memory rule)
        assert len(p.summary) > 10 and p.kv_cache_size_tokens >= 0
        assert p.to_dict()["block_size"] == p.block_size


def test_dcp_on_attention_free_model_is_a_value_error():
    with pytest.raises(KVExploreError, match="decode_context_parallel_size=2 shards"):
        plan("state-spaces/mamba-130m-hf", tensor_parallel_size=2, decode_context_parallel_size=2, gpu="A100")


def test_lazy_exports():
    assert kvexplore.Explorer.__name__ == "Explorer"
    assert callable(kvexplore.page_map)
    with pytest.raises(AttributeError):
        kvexplore.no_such_name  # noqa: B018


def test_capacity_is_group_aware():
    # 64 blocks; a 262,144-token request needs cdiv(262144, 544) = 482 attention
    # blocks plus 2 state snapshots in each of the 3 GDN groups (align mode).
    p = plan(QWEN, num_blocks=64, gpu="A100")
    assert p.model_config.max_model_len == 262_144
    assert p.max_concurrency == pytest.approx(64 / (482 + 3 * 2))
    assert p.kv_cache_size_tokens == int(64 / (482 + 3 * 2) * 262_144)


def test_a_vllm_assertion_names_the_file_function_and_condition():
    """vLLM's own assert (a padded Mamba page smaller than its state) comes
    back as one line naming vLLM's file, function and asserted condition."""
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    from kvexplore.planning.failures import vllm_error
    from kvexplore.planning.gpus import resolve_gpu
    from kvexplore.planning.inputs import PlanRequest
    from kvexplore.planning.models import load_model_config

    spec = MambaSpec(shapes=((10,),), dtypes=(torch.float32,), block_size=16, page_size_padded=4)
    with pytest.raises(AssertionError) as info:
        spec.page_size_bytes  # noqa: B018  vLLM asserts here
    err = vllm_error(load_model_config("Qwen/Qwen3.5-0.8B"), resolve_gpu("A100"), info.value,
                     PlanRequest(tensor_parallel_size=2))
    text = str(err)
    assert "AssertionError" in text and "tensor_parallel_size=2" in text
    assert "raised in vllm/v1/kv_cache_interface.py: page_size_bytes, which asserts " \
           "`self.page_size_padded >= page_size`" in text
    assert "AssertionError: AssertionError" not in text


def test_allocating_more_than_the_device_has_is_refused_with_the_bytes():
    """Qwen3.5-0.8B on an A100: 6 tensors of one 1,114,112-byte page per block
    (6 layers per group, pages of 2 x 544 x 2 heads x 256 x 2 B)."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=10**6)
    with pytest.raises(KVExploreError, match=r"backing allocation is 6,684,672,000,000 B "
                       r"\(num_blocks=1,000,000 x 6,684,672 B\); cpu has [\d,]+ B free"):
        kvexplore.allocate(p, device="cpu")
