"""Pipeline parallelism: a plan is one stage's worker, as vLLM builds it.

Oracles, each outside kvexplore's path:

* the layers of stage ``k`` are those vLLM's own ``get_pp_indices`` assigns
  it, from ``num_hidden_layers`` read off the bundled config by hand;
* every stage's groups, tensors and block count equal what vLLM's engine
  core functions give when called here directly on the stages' specs
  (``get_global_kv_cache_groups`` over all of them, then
  ``get_kv_cache_configs`` with every worker's memory);
* the block count is the fewest any stage's memory holds, by hand from each
  stage's tensors;
* the first and the last stage hold the embedding and the head: with tied
  embeddings the stages together hold one more vocab x hidden matrix than the
  whole model, by hand from the config.
"""

import json
import re

import pytest
import torch

import kvexplore
from kvexplore import (
    KVExploreError,
    allocate,
    apply_kv_cache_group_edits,
    plan,
    verify_roundtrip,
)
from kvexplore.planning.models import load_model_config

GiB = 1 << 30
MEMORY = 4 * GiB
#: (model, stages): even, uneven (26 = 6 + 7 + 7 + 6) and three-stage splits
CASES = [
    ("Qwen/Qwen3.5-0.8B", 2),
    ("google/gemma-3-1b-it", 4),
    ("ibm-granite/granite-4.0-h-350m", 3),
]


def _text_config(name: str) -> dict:
    config = json.loads((load_model_config(name).config_dir / "config.json").read_text())
    return config.get("text_config", config)


def _stages(name: str, pp: int, **kw) -> list:
    return [plan(name, gpu="H100", pipeline_parallel_size=pp, pipeline_parallel_rank=k,
                 kv_cache_memory_bytes=MEMORY, **kw) for k in range(pp)]


def _layer_index(layer_name: str) -> int:
    return int(re.search(r"layers\.(\d+)\.", layer_name).group(1))


@pytest.mark.release
@pytest.mark.parametrize(("name", "pp"), CASES)
def test_each_stage_holds_the_layers_vllm_assigns_it(name, pp):
    from vllm.distributed.utils import get_pp_indices

    layers = _text_config(name)["num_hidden_layers"]
    whole = plan(name, gpu="H100", kv_cache_memory_bytes=MEMORY)
    seen = {}
    for k, p in enumerate(_stages(name, pp)):
        start, end = get_pp_indices(layers, k, pp)
        assert p.pipeline_parallel_rank == k and p.pipeline_parallel_size == pp
        indices = {_layer_index(info.name) for info in p.layers}
        # every layer of these models has KV (attention or state)
        assert indices == set(range(start, end)), (k, sorted(indices), (start, end))
        seen.update(p.layer_specs)
    # the stages together register exactly the whole model's layers, same specs
    assert list(seen) == list(whole.layer_specs)
    assert all(seen[n] == whole.layer_specs[n] for n in seen)


@pytest.mark.parametrize(("name", "pp"), CASES)
def test_groups_tensors_and_blocks_are_vllms_over_every_stage(name, pp):
    from vllm.v1.core import kv_cache_planning as kcp

    stages = _stages(name, pp)
    workers = [dict(p.layer_specs) for p in stages]
    vc = stages[0].vllm_config
    groups = kcp.get_global_kv_cache_groups(vc, workers)
    configs = kcp.get_kv_cache_configs(vc, workers, [MEMORY] * pp, groups)
    for p, ref in zip(stages, configs, strict=True):
        cfg = p.kv_cache_config
        assert cfg.num_blocks == ref.num_blocks
        assert [list(g.layer_names) for g in cfg.kv_cache_groups] == \
            [list(g.layer_names) for g in ref.kv_cache_groups]
        assert [(t.size, list(t.layers)) for t in cfg.kv_cache_tensors] == \
            [(t.size, list(t.layers)) for t in ref.kv_cache_tensors]
    # by hand: every stage gets the same count, the fewest any stage's memory
    # holds (a stage's layers share one buffer: its first tensor spans it)
    per_block = [p.tensors[0].size // p.num_blocks for p in stages]
    assert {p.num_blocks for p in stages} == {min(MEMORY // b for b in per_block)}


def test_the_drafter_lives_on_the_last_stage():
    from vllm.v1.core import kv_cache_planning as kcp

    spec = {"method": "mtp", "num_speculative_tokens": 2}
    stages = _stages("Qwen/Qwen3.5-0.8B", 2, speculative_config=spec)
    whole = plan("Qwen/Qwen3.5-0.8B", gpu="H100", kv_cache_memory_bytes=MEMORY,
                 speculative_config=spec)
    draft = [info.name for info in whole.layers if info.is_draft]
    assert draft  # the MTP layer of the whole model
    # Model Runner V2 builds the speculator on the last pipeline rank only
    assert stages[0].drafter is None
    assert not any(info.is_draft for info in stages[0].layers)
    assert [info.name for info in stages[1].layers if info.is_draft] == draft
    workers = [dict(p.layer_specs) for p in stages]
    vc = stages[0].vllm_config
    configs = kcp.get_kv_cache_configs(vc, workers, [MEMORY] * 2,
                                       kcp.get_global_kv_cache_groups(vc, workers))
    for p, ref in zip(stages, configs, strict=True):
        assert p.num_blocks == ref.num_blocks
        assert [list(g.layer_names) for g in p.kv_cache_config.kv_cache_groups] == \
            [list(g.layer_names) for g in ref.kv_cache_groups]


def test_two_stages_of_qwen_halve_each_group_and_double_the_blocks():
    whole = plan("Qwen/Qwen3.5-0.8B", gpu="H100", kv_cache_memory_bytes=MEMORY)
    first, last = _stages("Qwen/Qwen3.5-0.8B", 2)
    # 24 layers, 12 per stage: each of the 4 groups keeps half its layers
    assert [len(g.layer_names) for g in whole.groups] == [6, 6, 6, 6]
    assert [len(g.layer_names) for g in first.groups] == [3, 3, 3, 3]
    assert first.bytes_per_block * 2 == whole.bytes_per_block
    # one block id: one padded page in each of the 3 slots every group shares
    assert first.bytes_per_block == 3 * first.mamba_page_size_padded
    assert first.num_blocks == MEMORY // first.bytes_per_block
    assert first.num_blocks >= 2 * whole.num_blocks


@pytest.mark.release
def test_first_and_last_stage_hold_embedding_and_head():
    # a text-only model: a multimodal one's encoder sits on the first stage
    # or on every stage, depending on the release
    name = "ibm-granite/granite-4.0-h-350m"
    text = _text_config(name)
    assert text["tie_word_embeddings"]
    whole = plan(name, gpu="H100", num_blocks=16)
    first, last = (plan(name, gpu="H100", num_blocks=16,
                        pipeline_parallel_size=2, pipeline_parallel_rank=k) for k in (0, 1))
    # tied embeddings: one matrix in the whole model, one on each end stage;
    # and the model class builds its final norm on every stage
    # (granitemoehybrid.py: GraniteMoeHybridModel.norm), all bfloat16
    head = text["vocab_size"] * text["hidden_size"] * 2
    norm = text["hidden_size"] * 2
    assert first.weight_bytes + last.weight_bytes == whole.weight_bytes + head + norm


def test_only_the_last_stage_profiles_the_sampler():
    whole = plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16)
    first, last = (plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16,
                        pipeline_parallel_size=2, pipeline_parallel_rank=k) for k in (0, 1))
    sc = whole.vllm_config.scheduler_config
    text = _text_config("Qwen/Qwen3.5-0.8B")
    logits_fp32 = sc.max_num_seqs * text["vocab_size"] * 4
    assert first.memory_profile().activation_peak.high < logits_fp32
    assert last.memory_profile().activation_peak.low >= logits_fp32


def test_the_plan_says_which_stage_it_is():
    p = plan("Qwen/Qwen3.5-0.8B", gpu="H100", pipeline_parallel_size=2,
             pipeline_parallel_rank=1, kv_cache_memory_bytes=MEMORY)
    assert "pp=2 (stage 1)" in repr(p)
    facts = p.to_dict()
    assert (facts["pipeline_parallel_size"], facts["pipeline_parallel_rank"]) == (2, 1)
    assert "fewest of the 2 pipeline stages" in p.derivation()["num_blocks"]
    # without pipeline parallelism the plan's facts are as they were
    assert "pipeline_parallel_size" not in plan("Qwen/Qwen3.5-0.8B", gpu="H100",
                                                kv_cache_memory_bytes=MEMORY).to_dict()


def test_a_stage_registers_and_edits_its_own_layers():
    p = plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=4,
             pipeline_parallel_size=2, pipeline_parallel_rank=1)
    caches = allocate(p, device="cpu")
    assert set(caches) == set(p.layer_specs)
    assert all(_layer_index(n) >= 12 for n in caches)
    edited = apply_kv_cache_group_edits(p, caches, kv_layout=p.kv_cache_layout)
    assert verify_roundtrip(p.kv_cache_config, caches, edited).ok
    assert isinstance(next(iter(caches.values())), torch.Tensor | list | tuple)


@pytest.mark.release
@pytest.mark.parametrize(("kw", "match"), [
    ({"pipeline_parallel_size": 2, "pipeline_parallel_rank": 2}, "pipeline_parallel_rank=2"),
    ({"pipeline_parallel_rank": 1}, "pipeline_parallel_size=1"),
    ({"pipeline_parallel_size": 2, "pipeline_parallel_rank": -1}, "pipeline_parallel_rank=-1"),
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size=0"),
])
def test_bad_stages_are_refused_by_name(kw, match):
    with pytest.raises(KVExploreError, match=match):
        plan("Qwen/Qwen3.5-0.8B", gpu="H100", **kw)


def test_capacity_refuses_a_pipeline_stage():
    p = plan("Qwen/Qwen3.5-0.8B", gpu="H100", pipeline_parallel_size=2)
    with pytest.raises(KVExploreError, match="pipeline_parallel_size=2"):
        kvexplore.capacity(p)


def test_cli_takes_the_stage(capsys):
    from kvexplore.cli import main

    assert main(["plan", "Qwen/Qwen3.5-0.8B", "--gpu", "H100", "--pp", "2",
                 "--pipeline-parallel-rank", "1", "--num-blocks", "16", "--json",
                 "--no-cache"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["pipeline_parallel_size"], facts["pipeline_parallel_rank"]) == (2, 1)


def test_offloading_takes_the_stages_from_the_plan():
    from kvexplore.offloading import offload_config

    p = plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16,
             pipeline_parallel_size=2, pipeline_parallel_rank=1)
    config = offload_config(p).config
    assert config.parallel.pp_size == 2
    assert [list(g.layer_names) for g in config.groups] == [list(g.layer_names) for g in p.groups]
    with pytest.raises(KVExploreError, match="pipeline_parallel_size=4"):
        offload_config(p, pipeline_parallel_size=4)
