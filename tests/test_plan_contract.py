"""A plan is immutable and shared safely; bad inputs name the value.

Plans are cached: two callers asking for the same inputs get the same object.
What either can reach and mutate must be a copy, or one caller's change would
alter the other's plan.
"""

import dataclasses
import gc
import json
import weakref

import pytest
import torch

import kvexplore
from kvexplore.editing.plan_edits import plan_edits
from kvexplore.memo import per_plan
from kvexplore.registration import registered_views

QWEN = "Qwen/Qwen3.5-0.8B"


def test_plan_is_frozen(qwen_a100):
    with pytest.raises(dataclasses.FrozenInstanceError):
        qwen_a100.gpu = None
    with pytest.raises(TypeError):
        qwen_a100.layer_specs["x"] = None  # a read-only mapping


def test_callers_cannot_change_a_shared_plan():
    qwen_a100 = kvexplore.plan(QWEN, gpu="A100")
    again = kvexplore.plan(QWEN, gpu="A100")
    assert again is qwen_a100  # the same cached object
    qwen_a100.cache_config.block_size = 16
    qwen_a100.vllm_config.cache_config.block_size = 16
    qwen_a100.model_config.max_model_len = 7
    qwen_a100.parallel_config.tensor_parallel_size = 8
    cfg = qwen_a100.kv_cache_config
    cfg.num_blocks = 1
    cfg.kv_cache_groups[0].layer_names.append("not.a.layer")
    cfg.kv_cache_tensors[0].layers.clear()
    with pytest.raises(AttributeError):
        qwen_a100.groups[0].layer_names.clear()  # a tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        qwen_a100.groups[0].kernel_block_size = 1
    table = qwen_a100.group_table
    table.loc[0, "layers"] = 99
    summary = qwen_a100.summary
    summary.loc[1, "value"] = "changed"
    inputs = qwen_a100.inputs
    inputs["tensor_parallel_size"] = 4
    # hand arithmetic from the config: 24 layers, 6 per group, 544 tokens on an A100
    assert again.block_size == 544 and again.cache_config.block_size == 544
    assert again.model_config.max_model_len == 262144 == again.max_model_len
    assert again.parallel_config.tensor_parallel_size == 1 == again.tensor_parallel_size
    assert again.num_blocks == again.kv_cache_memory_bytes // (6 * 544 * 2048)
    assert again.num_blocks == again.kv_cache_config.num_blocks
    assert [len(g.layer_names) for g in again.groups] == [6, 6, 6, 6]
    assert len(again.kv_cache_config.kv_cache_tensors[0].layers) == 6
    assert list(again.group_table.layers) == [6, 6, 6, 6]
    assert again.summary.loc[1, "value"] == QWEN
    assert again.inputs["tensor_parallel_size"] == 1
    # a plan made afresh (cold caches) tells the same story as the one changed above
    kvexplore.clear_plan_cache()
    assert again.explain() == kvexplore.plan(QWEN, gpu="A100").explain()


def test_callers_cannot_change_the_hf_config_a_plan_was_built_from(qwen_a100):
    """The HF config objects belong to the build every plan of one model and
    GPU shares; what a caller reaches of them is a copy."""
    mc = qwen_a100.model_config
    assert mc.hf_text_config is mc.hf_config.text_config  # the copy keeps vLLM's sharing
    mc.hf_text_config.num_hidden_layers = 3
    mc.hf_text_config.layer_types.clear()
    qwen_a100.vllm_config.model_config.hf_config.text_config.full_attention_interval = 1
    config = qwen_a100.model.config
    config["text_config"]["full_attention_interval"] = 1
    # from the config by hand: 24 layers, every 4th full attention, 6 per group
    text = kvexplore.plan(QWEN, gpu="A100").model_config.hf_text_config
    assert text.num_hidden_layers == 24 and len(text.layer_types) == 24
    assert text.full_attention_interval == 4
    assert qwen_a100.model.config["text_config"]["full_attention_interval"] == 4
    sibling = kvexplore.plan(QWEN, gpu="A100", num_blocks=7)  # same build, new plan
    assert [len(g.layer_names) for g in sibling.groups] == [6, 6, 6, 6]
    assert sibling.block_size == 544 and sibling.num_blocks == 7
    assert sibling.vllm_config.cache_config.block_size == 544


def test_one_memo_per_plan_released_with_the_plan():
    p = kvexplore.plan(QWEN, gpu="A100", num_blocks=5)
    views = registered_views(p)
    assert registered_views(p) is views
    assert plan_edits(p) is plan_edits(p)
    other = kvexplore.plan(QWEN, gpu="A100", num_blocks=6)
    assert registered_views(other) is not views
    assert next(iter(views.values())).shape[0] == 5 * 1  # mamba: one page per block

    class Probe:
        pass

    probe = Probe()
    calls = []
    assert per_plan(probe, "k", lambda: calls.append(1) or "v") == "v"
    assert per_plan(probe, "k", lambda: calls.append(1) or "w") == "v"
    assert calls == [1]
    ref = weakref.ref(probe)
    del probe
    gc.collect()
    assert ref() is None  # the memo does not keep its plan alive


def test_memo_does_not_keep_errors():
    calls = []

    class Probe:
        pass

    probe = Probe()

    def failing():
        calls.append(1)
        raise kvexplore.KVExploreError("no")

    for _ in range(2):
        with pytest.raises(kvexplore.KVExploreError):
            per_plan(probe, "k", failing)
    assert calls == [1, 1]


@pytest.mark.parametrize(
    "kwargs,names",
    [
        ({"mamba_ssm_cache_dtype": "flaot32"}, ["mamba_ssm_cache_dtype='flaot32'", "float32"]),
        ({"enable_prefix_caching": "yes"}, ["enable_prefix_caching='yes'", "True, False or None"]),
        ({"max_model_len": 0}, ["max_model_len=0", "-1 (auto-fit"]),
        ({"max_model_len": -2}, ["max_model_len=-2", ">= 1"]),
        ({"max_model_len": 1.5}, ["max_model_len=1.5", "integer"]),
        ({"tensor_parallel_size": 0}, ["tensor_parallel_size=0", ">= 1"]),
        ({"kv_cache_dtype": "fp9"}, ["kv_cache_dtype='fp9'"]),
        ({"gpu": "V100"}, ["V100"]),
    ],
)
def test_bad_plan_inputs_name_the_value(kwargs, names):
    kwargs = {"gpu": "A100", **kwargs}
    with pytest.raises(kvexplore.KVExploreError) as info:
        kvexplore.plan(QWEN, **kwargs)
    for name in names:
        assert name in str(info.value)


def test_mla_backend_for_a_non_mla_model():
    with pytest.raises(kvexplore.KVExploreError) as info:
        kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", attention_backend="FLASHMLA")
    text = str(info.value)
    assert "attention_backend='FLASHMLA'" in text and "H100" in text
    assert "Llama-3.1-8B" in text


def test_allocate_bad_inputs(qwen_a100):
    with pytest.raises(kvexplore.KVExploreError, match="device='tpu9' is not a torch device"):
        kvexplore.allocate(qwen_a100, device="tpu9")
    with pytest.raises(kvexplore.KVExploreError, match=r"registration='weird' is invalid; expected one of \['unified', 'legacy'\]"):
        kvexplore.allocate(qwen_a100, device="cpu", registration="weird")


def test_allocate_and_capacity_are_functions_of_their_stages():
    """One way to call each stage: the package's names are the stages'
    functions, and a plan (data) has no method that reaches a later stage."""
    from kvexplore.capacity_planning import capacity
    from kvexplore.registration import allocate

    assert kvexplore.allocate is allocate and kvexplore.capacity is capacity
    assert not hasattr(kvexplore.Plan, "allocate") and not hasattr(kvexplore.Plan, "capacity")
    small = kvexplore.plan(QWEN, gpu="A100", num_blocks=2)
    kv = kvexplore.allocate(small)
    assert sorted(kv) == sorted(small.layer_specs)
    # a unified GDN row: conv 3 x 6,144 x 2 B + SSM 16 x 128 x 128 x 4 B per block
    assert kv["language_model.model.layers.0.linear_attn"].shape == (2, 1, 1, 1_085_440)


def test_allocate_cuda_where_there_is_none_or_some():
    small = kvexplore.plan(QWEN, gpu="A100", num_blocks=2)
    if torch.cuda.is_available():
        kv = kvexplore.allocate(small, device="cuda")
        assert {t.device.type for v in kv.values() for t in (v if isinstance(v, list) else [v])} == {"cuda"}
    else:
        with pytest.raises(kvexplore.KVExploreError, match="device='cuda' asked for CUDA but no CUDA device is available"):
            kvexplore.allocate(small, device="cuda")


def test_config_json_that_is_a_list(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(kvexplore.KVExploreError) as info:
        kvexplore.plan(str(path), gpu="A100")
    assert str(path) in str(info.value) and "JSON list" in str(info.value)
    assert json.loads(path.read_text()) == [1, 2]  # nothing modified
