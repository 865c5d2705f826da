"""offload_config: values, reasons, errors and displays."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
from offload_reference import offload_cli_table

import kvexplore
import kvexplore.offloading.config
from kvexplore import KVExploreError
from kvexplore.offloading.config import (
    OffloadConfigError,
    OffloadResult,
    offload_config,
)

QWEN = "Qwen/Qwen3.5-0.8B"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DSV3 = "deepseek-ai/DeepSeek-V3"
OSS = "openai/gpt-oss-20b"


def test_returns_vllms_dataclass():
    from vllm.v1.kv_offload.config import OffloadingConfig

    r = offload_config(kvexplore.plan(QWEN, gpu="A100"))
    assert isinstance(r, OffloadResult)
    assert type(r.config) is OffloadingConfig


def test_worked_example_tp4_dcp2():
    r = offload_config(
        kvexplore.plan(QWEN, tensor_parallel_size=4, decode_context_parallel_size=2, gpu="A100")
    )
    c = r.config
    assert [g.group_id for g in c.groups] == [0, 1, 2, 3]
    # GDN groups keep their state per rank, the attention group spans DCP ranks
    assert [g.tokens_per_block for g in c.groups] == [272, 272, 272, 544]
    assert [g.sliding_window_size_in_chunks for g in c.groups] == [1, 1, 1, None]
    assert c.cache.tokens_per_hash == 272
    assert c.cache.blocks_per_chunk == 1
    assert (c.parallel.tp_size, c.parallel.dcp_size, c.parallel.world_size) == (4, 2, 4)
    assert c.replicated_layout is False
    assert c.parallel.is_parallelism_agnostic is False
    assert r.rule("groups[3].tokens_per_block") == (
        "block_size 272 x DCP 2 (FullAttentionSpec is DCP-sharded)"
    )
    assert "gcd(272, 272, 272, 544)" in r.rule("cache.tokens_per_hash")


def test_worked_example_tp1_block_size_chunk():
    p = kvexplore.plan(QWEN, gpu="A100")
    r = offload_config(p, extra_config={"block_size": 1088})
    assert r.config.cache.blocks_per_chunk == 2
    assert r.rule("cache.blocks_per_chunk") == (
        "extra_config['block_size'] 1088 // 544 tokens per block"
    )
    # bytes per block: the one backing allocation over num_blocks
    tensor = p.kv_cache_config.kv_cache_tensors[0].size
    assert r.config.worker_kv_bytes_per_block == tensor // p.num_blocks


def test_agnostic_reason_names_heads_per_rank_times_tp():
    r = offload_config(kvexplore.plan(LLAMA, tensor_parallel_size=16, gpu="A100"))
    assert r.config.parallel.is_parallelism_agnostic is False
    assert "1 KV heads per rank x TP 16 = 16 != 8 total KV heads" in r.rule(
        "parallel.is_parallelism_agnostic"
    )
    ok = offload_config(kvexplore.plan(LLAMA, tensor_parallel_size=4, gpu="A100"))
    assert ok.config.parallel.is_parallelism_agnostic is True
    assert "2 KV heads per rank x TP 4 = 8 == 8 total KV heads" in ok.rule(
        "parallel.is_parallelism_agnostic"
    )


def test_agnostic_false_for_v2_runner_and_pcp():
    p = kvexplore.plan(LLAMA, tensor_parallel_size=4, gpu="A100")
    r = offload_config(p, use_v2_model_runner=True, prefill_context_parallel_size=2)
    assert r.config.parallel.is_parallelism_agnostic is False
    why = r.rule("parallel.is_parallelism_agnostic")
    assert "V2 model runner" in why and "PCP 2 != 1" in why
    assert r.config.parallel.world_size == 8


def test_mla_replicated_layout_and_what_breaks_it():
    p = kvexplore.plan(DSV3, tensor_parallel_size=8, gpu="A100", num_blocks=64)
    assert p.kv_cache_config.kv_tp_replicas == 8
    r = offload_config(p)
    assert r.config.replicated_layout is True
    assert "kv_tp_replicas 8 == TP 8" in r.rule("replicated_layout")
    for kw, reason in [
        ({"nnodes_within_dp": 2}, "nnodes_within_dp 2 != 1"),
        ({"distributed_executor_backend": "ray"}, "executor backend 'ray' != 'mp'"),
        ({"prefill_context_parallel_size": 2}, "PCP 2 != 1"),
    ]:
        r = offload_config(p, **kw)
        assert r.config.replicated_layout is False, kw
        assert reason in r.rule("replicated_layout"), (kw, r.rule("replicated_layout"))
    # two pipeline stages (the plan's PP): no longer TP only
    pp = offload_config(p.replace(pipeline_parallel_size=2))
    assert pp.config.replicated_layout is False
    assert "PP 2 != 1" in pp.rule("replicated_layout")
    # DCP shards the tokens: no longer replicated
    d = offload_config(
        kvexplore.plan(DSV3, tensor_parallel_size=8, decode_context_parallel_size=2, gpu="A100",
                       num_blocks=64)
    )
    assert d.config.replicated_layout is False
    assert "DCP 2 != 1" in d.rule("replicated_layout")


def test_canonical_layout_gate():
    # MLA: certifiable, so agnostic and (pure MLA, one node, mp) replicated
    r = offload_config(
        kvexplore.plan(DSV3, tensor_parallel_size=8, gpu="A100", num_blocks=64),
        extra_config={"canonical_layout": True},
    )
    assert r.config.canonical_layout is True
    assert r.config.parallel.is_parallelism_agnostic is True
    assert r.config.replicated_layout is True
    # sliding window + full attention with sharded heads: agnostic, not replicated
    g = offload_config(
        kvexplore.plan(OSS, tensor_parallel_size=8, gpu="A100"),
        extra_config={"canonical_layout": True},
    )
    assert g.config.parallel.is_parallelism_agnostic is True
    assert g.config.replicated_layout is False
    # Mamba layers cannot be certified
    q = offload_config(kvexplore.plan(QWEN, gpu="A100"), extra_config={"canonical_layout": True})
    assert q.config.parallel.is_parallelism_agnostic is False
    assert "MambaSpec is not an attention spec" in q.rule(
        "parallel.is_parallelism_agnostic"
    )
    # a string is refused: vLLM's bool() would read "no" as True
    with pytest.raises(OffloadConfigError, match="would read it as True") as info:
        offload_config(kvexplore.plan(LLAMA, gpu="A100"), extra_config={"canonical_layout": "no"})
    assert info.value.code == "canonical_layout_not_bool"


def test_sliding_window_chunks():
    p = kvexplore.plan(OSS, gpu="A100")
    one = offload_config(p)
    assert [g.sliding_window_size_in_chunks for g in one.config.groups] == [8, None]
    four = offload_config(p, extra_config={"blocks_per_chunk": 4})
    assert [g.sliding_window_size_in_chunks for g in four.config.groups] == [2, None]
    assert "cdiv(128, 64)" in four.rule("groups[0].sliding_window_size_in_chunks")


def test_parallel_section():
    p = kvexplore.plan(LLAMA, tensor_parallel_size=2, pipeline_parallel_size=2,
                       data_parallel_size=4, gpu="A100")
    r = offload_config(
        p,
        data_parallel_rank=3,
        rank=3,
        enable_kv_cache_events=True,
        engine_id="e1",
    )
    par = r.config.parallel
    assert (par.world_size, par.rank, par.pp_size) == (4, 3, 2)
    assert (par.data_parallel_index, par.data_parallel_size) == (3, 4)
    assert par.data_parallel_rank_local is None
    assert r.config.enable_kv_cache_events is True
    assert r.config.engine_id == "e1"
    ext = offload_config(
        kvexplore.plan(LLAMA, tensor_parallel_size=2, data_parallel_size=2, gpu="A100"),
        distributed_executor_backend="external_launcher",
    )
    assert ext.config.parallel.world_size == 4
    assert "external_launcher" in ext.rule("parallel.world_size")


def test_model_section_dtype():
    assert offload_config(kvexplore.plan(LLAMA, gpu="A100")).config.model.dtype == "bfloat16"
    fp8 = offload_config(kvexplore.plan(LLAMA, kv_cache_dtype="fp8", gpu="A100"))
    assert fp8.config.model.dtype == "fp8"
    assert fp8.config.model.max_model_len == 131072


# -- errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, code, facts",
    [
        (
            {"block_size": 1000},
            "block_size_not_multiple",
            ["1000", "544 tokens", "use 1088"],
        ),
        ({"block_size": 544, "blocks_per_chunk": 2}, "both_chunk_keys", ["544", "2"]),
        (
            {"blocks_per_chunk": 0},
            "blocks_per_chunk_not_positive",
            ["0", "greater than 0"],
        ),
        ({"blocks_per_chunk": -2}, "blocks_per_chunk_not_positive", ["-2"]),
        ({"blocks_per_chunk": "two"}, "not_an_integer", ["'two'"]),
        ({"block_size": [544]}, "not_an_integer", ["[544]"]),
        ({"block_size": float("nan")}, "not_an_integer", ["nan", "int()"]),
        ({"blocks_per_chunk": float("inf")}, "not_an_integer", ["inf", "int()"]),
        ({"block_size": float("-inf")}, "not_an_integer", ["-inf"]),
    ],
)
def test_extra_config_errors(extra, code, facts):
    with pytest.raises(ValueError) as info:
        offload_config(kvexplore.plan(QWEN, gpu="A100"), extra_config=extra)
    assert isinstance(info.value, OffloadConfigError)
    assert info.value.code == code
    for fact in facts:
        assert fact in str(info.value)


def test_block_size_needs_one_tokens_per_block():
    p = kvexplore.plan(QWEN, tensor_parallel_size=4, decode_context_parallel_size=2, gpu="A100")
    with pytest.raises(
        OffloadConfigError, match=r"\{0: 272, 1: 272, 2: 272, 3: 544\}"
    ) as info:
        offload_config(p, extra_config={"block_size": 544})
    assert info.value.code == "mixed_tokens_per_block"
    # blocks_per_chunk works where block_size cannot
    assert (
        offload_config(
            p, extra_config={"blocks_per_chunk": 2}
        ).config.cache.blocks_per_chunk
        == 2
    )


def test_tokens_per_hash_error_without_prefix_caching():
    p = kvexplore.plan(QWEN, enable_prefix_caching=False, gpu="A100")
    with pytest.raises(OffloadConfigError) as info:
        offload_config(p)
    assert info.value.code == "tokens_per_hash"
    assert "tokens_per_block=262144" in str(info.value)
    assert "--enable-prefix-caching" in str(info.value)


def test_cross_attention_is_unsupported():
    with pytest.raises(OffloadConfigError, match="CrossAttentionSpec") as info:
        offload_config(kvexplore.plan("openai/whisper-small", gpu="A100"))
    assert info.value.code == "unsupported_spec"


def test_zero_block_size_is_refused_with_or_without_a_window():
    # vLLM divides by zero with a sliding window and, without one, derives
    # 0 blocks per chunk: no backend could use either
    for model in (OSS, LLAMA):
        with pytest.raises(OffloadConfigError) as info:
            offload_config(kvexplore.plan(model, gpu="A100"), extra_config={"block_size": 0})
        assert info.value.code == "block_size_not_positive"
        assert "extra_config['block_size']=0" in str(info.value)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size=0"),
        ({"prefill_context_parallel_size": 1.5}, "prefill_context_parallel_size=1.5"),
        ({"data_parallel_size": True}, "data_parallel_size=True"),
        ({"data_parallel_size": 2}, "data_parallel_size=2 differs from the plan's data_parallel_size=1"),
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2 differs from the plan's"),
        ({"tensor_parallel_size": 2}, r"tensor_parallel_size=2 .*plan\(\.\.\., tensor_parallel_size=2\)"),
        ({"data_parallel_rank": 1}, r"data_parallel_rank=1 .*\[0, 1\) for the plan's data_parallel_size=1"),
        (
            {"distributed_executor_backend": "slurm"},
            "distributed_executor_backend='slurm'",
        ),
        (
            {"nnodes_within_dp": 2, "distributed_executor_backend": "ray"},
            "nnodes_within_dp=2",
        ),
        ({"rank": 4}, r"rank=4 .*\[0, 4\)"),
        ({"use_v2_model_runner": "yes"}, "use_v2_model_runner='yes'"),
        ({"enable_kv_cache_events": 1}, "enable_kv_cache_events=1"),
        ({"engine_id": ""}, "engine_id=''"),
        ({"extra_config": [("block_size", 16)]}, "expected a mapping"),
        ({"prefill_context_parallel_size": 2}, r"expected DCP in \[1, 2, 8\]"),
    ],
)
def test_input_errors_are_value_errors(kw, match):
    p = kvexplore.plan(LLAMA, tensor_parallel_size=4, gpu="A100")
    if "expected DCP" in match:
        p = kvexplore.plan(DSV3, tensor_parallel_size=4, decode_context_parallel_size=4, gpu="A100")
    with pytest.raises(KVExploreError, match=match):
        offload_config(p, **kw)


def test_non_plan_is_rejected():
    with pytest.raises(KVExploreError, match="expects a kvexplore.Plan"):
        offload_config(QWEN)


def test_extra_config_is_never_mutated():
    extra = {"block_size": 1088, "canonical_layout": True, "nested": {"a": [1]}}
    snapshot = copy.deepcopy(extra)
    r = offload_config(kvexplore.plan(QWEN, gpu="A100"), extra_config=extra)
    assert extra == snapshot
    extra["block_size"] = 544  # the result does not alias the caller's dict
    assert r.config.extra_config["block_size"] == 1088
    assert r.config.extra_config is not extra


# -- displays ------------------------------------------------------------------


def test_explain_reasons_table_and_exports():
    r = offload_config(
        kvexplore.plan(QWEN, tensor_parallel_size=4, gpu="A100"),
        extra_config={"blocks_per_chunk": 3},
    )
    text = r.explain()
    for field in [
        "groups",
        "groups[3].tokens_per_block",
        "groups[0].sliding_window_size_in_chunks",
        "cache.tokens_per_hash",
        "cache.blocks_per_chunk",
        "worker_kv_bytes_per_block",
        "replicated_layout",
        "parallel.is_parallelism_agnostic",
        "canonical_layout",
        "parallel.world_size",
        "model.dtype",
    ]:
        assert f"\n{field} = " in f"\n{text}", field
    assert "cache.blocks_per_chunk = 3: extra_config['blocks_per_chunk'] = 3" in text
    reasons = r.reasons
    assert list(reasons.columns) == ["field", "value", "rule"]
    assert (reasons.rule != "").all()
    table = r.table()
    assert isinstance(table, pd.DataFrame)
    assert len(table) > len(reasons)
    assert "engine_id" in set(table.field)
    d = r.to_dict()
    again = json.loads(json.dumps(d))
    assert again["cache"] == {"tokens_per_hash": 272, "blocks_per_chunk": 3}
    assert again["parallel"]["tp_size"] == 4
    assert again["inputs"]["model"] == QWEN
    assert "replicated_layout" in again["reasons"]
    assert "tokens_per_block=[272, 272, 272, 272]" in repr(r)
    html = r._repr_html_()
    assert html.startswith("<div>") and "is_parallelism_agnostic" in html
    cli = offload_cli_table(r)
    assert "cache.blocks_per_chunk" in cli and "rule" in cli.splitlines()[0]


def test_rule_for_unknown_field():
    r = offload_config(kvexplore.plan(LLAMA, gpu="A100"))
    with pytest.raises(KVExploreError, match="not a field"):
        r.rule("tokens_per_chunk")
    # with one group the short name is unique, with four it is ambiguous
    assert r.rule("tokens_per_block") == r.rule("groups[0].tokens_per_block")
    q = offload_config(kvexplore.plan(QWEN, gpu="A100"))
    with pytest.raises(KVExploreError, match="not a field"):
        q.rule("tokens_per_block")
    # a unique last component names the nested field
    assert r.rule("is_parallelism_agnostic") == r.rule(
        "parallel.is_parallelism_agnostic"
    )
    assert r.rule("tokens_per_hash") == r.rule("cache.tokens_per_hash")


def test_to_dict_handles_non_json_extra_values():
    r = offload_config(
        kvexplore.plan(LLAMA, gpu="A100"), extra_config={"obj": object(), "t": (1, 2)}
    )
    d = json.loads(json.dumps(r.to_dict()))
    assert d["extra_config"]["t"] == [1, 2]
    assert d["extra_config"]["obj"].startswith("<object object")
