"""sweep(): one row per combination, plans shared, invalid rows kept."""

from __future__ import annotations

import importlib
import json

import pandas as pd
import pytest

import kvexplore
from kvexplore import KVExploreError
from kvexplore.offloading.config import offload_config
from kvexplore.offloading.sweep import RESULT_COLUMNS, sweep

# `kvexplore.offloading.sweep` is the function on the package; the module lives in sys.modules
sweep_module = importlib.import_module("kvexplore.offloading.sweep")

QWEN = "Qwen/Qwen3.5-0.8B"


def test_rows_columns_and_order():
    df = sweep(
        QWEN, gpu="A100",
        tensor_parallel_size=[1, 2, 4, 8],
        decode_context_parallel_size=[1, 2],
        extra_config=[None, {"blocks_per_chunk": 2}],
    )
    assert len(df) == 4 * 2 * 2
    assert list(df.columns) == [
        "model",
        "gpu",
        "tensor_parallel_size",
        "decode_context_parallel_size",
        "extra_config",
        *RESULT_COLUMNS,
    ]
    assert (df.model == QWEN).all()
    # itertools.product order: the last axis varies fastest
    assert df.tensor_parallel_size.tolist()[:4] == [1, 1, 1, 1]
    assert (
        pd.isna(df.extra_config[0]) and df.extra_config[1] == '{"blocks_per_chunk": 2}'
    )
    # TP 1 and TP 2 cannot take DCP 2 (4 rows); vLLM's Qwen3.5 model cannot
    # split its vision tower's 12 heads over TP 8 (4 rows)
    assert df.error.isna().sum() == 8
    assert df[df.tensor_parallel_size == 8].error.str.contains("12 is not divisible by 8").all()


def test_invalid_combinations_are_rows_not_exceptions():
    df = sweep(
        QWEN, gpu="A100",
        tensor_parallel_size=[1, 2, 4],
        decode_context_parallel_size=[1, 2],
        extra_config=[{"block_size": 544}, {"block_size": 545}],
    )
    bad_plan = df[
        (df.tensor_parallel_size == 2) & (df.decode_context_parallel_size == 2)
    ]
    assert bad_plan.error.str.contains(
        "greater than the model's total number of KV heads"
    ).all()
    assert bad_plan.gpu_block_size.isna().all()
    bad_chunk = df[
        (df.tensor_parallel_size == 1) & (df.decode_context_parallel_size == 1)
    ]
    assert pd.isna(bad_chunk.error.tolist()[0])
    assert "use 1088 instead" in bad_chunk.error.tolist()[1]
    # TP 4, DCP 2: attention spans 544 tokens, GDN 272: block_size cannot be used
    mixed = df[(df.tensor_parallel_size == 4) & (df.decode_context_parallel_size == 2)]
    assert mixed.error.str.contains("share one tokens_per_block").all()


def test_rows_equal_offload_config():
    df = sweep(
        "deepseek-ai/DeepSeek-V3",
        tensor_parallel_size=[2, 8],
        pipeline_parallel_size=[1, 2],
        extra_config=[{"canonical_layout": True}, {}],
    )
    for row in df.itertuples():
        # PP is a plan keyword: the row is stage 0's worker, with its PP size
        p = kvexplore.plan(
            "deepseek-ai/DeepSeek-V3", tensor_parallel_size=row.tensor_parallel_size,
            pipeline_parallel_size=row.pipeline_parallel_size, gpu="A100")
        r = offload_config(p, extra_config=json.loads(row.extra_config))
        assert r.config.parallel.pp_size == row.pipeline_parallel_size
        c = r.config
        assert pd.isna(row.error)
        assert row.tokens_per_block == tuple(g.tokens_per_block for g in c.groups)
        assert row.worker_kv_bytes_per_block == c.worker_kv_bytes_per_block
        assert row.replicated_layout == c.replicated_layout
        assert row.replicated_layout_reason == r.rule("replicated_layout")
        assert row.is_parallelism_agnostic == c.parallel.is_parallelism_agnostic
        assert row.is_parallelism_agnostic_reason == r.rule(
            "parallel.is_parallelism_agnostic"
        )
        assert row.tokens_per_hash == c.cache.tokens_per_hash
        assert row.blocks_per_chunk == c.cache.blocks_per_chunk
        assert row.gpu_block_size == p.block_size
        assert row.tokens_per_gib == p.tokens_per_gib
        assert row.padding_share == p.padding_share
        assert row.world_size == c.parallel.world_size
    assert df.replicated_layout.any() and not df.replicated_layout.all()


def test_plans_are_reused(monkeypatch):
    calls = []
    real = sweep_module.make_plan

    def counting(model, **kw):
        calls.append(kw)
        return real(model, **kw)

    monkeypatch.setattr(sweep_module, "make_plan", counting)
    df = sweep(
        QWEN, gpu="A100",
        tensor_parallel_size=[1, 4],
        pipeline_parallel_size=[1, 2, 4],
        rank=[0],
        use_v2_model_runner=[False, True],
    )
    assert len(df) == 12
    # one plan per (TP, PP) (PP is a plan keyword), shared by the two runner rows each
    assert len(calls) == 6


def test_scalars_are_fixed_and_ranges_are_axes():
    df = sweep(
        QWEN, gpu="A100", tensor_parallel_size=4, kv_cache_dtype=("auto", "fp8"), rank=range(3)
    )
    assert len(df) == 6
    assert set(df.tensor_parallel_size) == {4}
    assert df["rank"].tolist() == [0, 1, 2, 0, 1, 2]
    assert df.error.isna().all()
    fp8 = df[df.kv_cache_dtype == "fp8"]
    assert (
        fp8.gpu_block_size != df[df.kv_cache_dtype == "auto"].gpu_block_size.iloc[0]
    ).all()


def test_bad_offload_inputs_become_rows():
    df = sweep(QWEN, gpu="A100", rank=[0, 5], distributed_executor_backend=["mp", "slurm"])
    assert pd.isna(df.error.tolist()[0])
    assert "distributed_executor_backend='slurm'" in df.error.tolist()[1]
    assert "rank=5" in df.error.tolist()[2]


def test_usage_errors_raise():
    with pytest.raises(KVExploreError, match="unknown keyword"):
        sweep(QWEN, gpu="A100", tensor_parallel=[1, 2])
    with pytest.raises(KVExploreError, match="empty axis"):
        sweep(QWEN, gpu="A100", tensor_parallel_size=[])
    with pytest.raises(ValueError):
        sweep("/no/such/dir/config.json", tensor_parallel_size=[1])


def test_no_axes_is_one_row():
    df = sweep(QWEN, gpu="A100")
    assert len(df) == 1
    assert df.tokens_per_block[0] == (544, 544, 544, 544)


def test_process_pool_gives_the_sequential_rows():
    """A sweep on a local process pool (each worker plans its own copy) gives
    exactly the rows of the sequential sweep, in the same order; so does a
    capacity sweep over models and a plan."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from kvexplore.capacity_planning import capacity_sweep

    axes = dict(gpu=["A100", "H100"], num_blocks=64, block_size=[None, 1024])
    sequential = sweep("Qwen/Qwen3.5-0.8B", store=False, **axes)
    models = ["Qwen/Qwen3.5-0.8B", kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", max_model_len=8192)]
    cap_seq = capacity_sweep(models, store=False, gpu_memory_utilization=0.85)
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        parallel = sweep("Qwen/Qwen3.5-0.8B", executor=pool, store=False, **axes)
        cap_par = capacity_sweep(models, executor=pool, store=False, gpu_memory_utilization=0.85)
    assert len(sequential) == 4 and sequential["error"].isna().all()
    pd.testing.assert_frame_equal(parallel, sequential)
    pd.testing.assert_frame_equal(cap_par, cap_seq)
    assert cap_seq["max_model_len"].tolist()[1] == 8192  # the plan's own inputs travel
