"""vLLM's own inputs for ``build_offloading_config``: what the offloading
conformance test and benchmark hand vLLM to compare kvexplore against.

A test module, not library code: it builds real ``ParallelConfig`` /
``KVTransferConfig`` / ``KVEventsConfig`` objects and sets the ``RANK``
environment variable ``external_launcher`` reads while one is built.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from kvexplore.errors import KVExploreError
from kvexplore.offloading.options import DEFAULT_ENGINE_ID
from kvexplore.offloading.standin import VllmConfigStandIn


@contextmanager
def environ(changes: dict[str, str]):
    """``os.environ`` with ``changes`` inside the block, restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*changes, "VLLM_ENABLE_V1_MULTIPROCESSING")}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def vllm_parallel_config(
    plan,
    *,
    pipeline_parallel_size: int = 1,
    prefill_context_parallel_size: int = 1,
    data_parallel_size: int = 1,
    data_parallel_rank: int = 0,
    distributed_executor_backend: str | None = "mp",
    nnodes_within_dp: int = 1,
    rank: int = 0,
):
    """A real ``vllm.config.ParallelConfig`` for these inputs (plan's TP and DCP).

    ``nnodes_within_dp`` becomes ``nnodes`` with every DP replica local to
    the node group (``data_parallel_size_local = data_parallel_size``), so
    ``ParallelConfig.nnodes_within_dp`` equals it.  Ray is not installed
    offline, so a valid ``"ray"`` configuration is built as ``"mp"`` and
    renamed afterwards (with ``nnodes > 1`` it is built as ``"ray"``, which
    vLLM rejects); ``external_launcher`` gets the ``RANK`` variable it reads,
    and the environment is restored.
    """
    from vllm.config import ParallelConfig

    pc_plan = plan.vllm_config.parallel_config
    backend = distributed_executor_backend
    kwargs = dict(
        tensor_parallel_size=pc_plan.tensor_parallel_size,
        decode_context_parallel_size=pc_plan.decode_context_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        prefill_context_parallel_size=prefill_context_parallel_size,
        data_parallel_size=data_parallel_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size_local=data_parallel_size,
        nnodes=nnodes_within_dp,
        distributed_executor_backend="mp" if backend == "ray" and nnodes_within_dp == 1 else backend,
        rank=rank,
    )
    per_replica = pipeline_parallel_size * pc_plan.tensor_parallel_size * prefill_context_parallel_size
    env = {"RANK": str(data_parallel_rank * per_replica)} if backend == "external_launcher" else {}
    with environ(env):
        try:
            pc = ParallelConfig(**kwargs)
        except Exception as exc:  # pydantic ValidationError carries the reason
            raise KVExploreError(f"vLLM's ParallelConfig rejects {kwargs}: {exc}") from None
    if backend == "ray":
        pc.distributed_executor_backend = "ray"
    return pc


def vllm_offload_inputs(plan, *, parallel_config=None, **kw):
    """``(vllm_config, kv_cache_config)`` to call vLLM's own ``build_offloading_config``.

    The stand-in (:class:`kvexplore.offloading.standin.VllmConfigStandIn`) carries the
    plan's ``ModelConfig`` / ``CacheConfig``, a real ``ParallelConfig``
    (:func:`vllm_parallel_config`, or ``parallel_config`` when given, to share
    one across calls), a real ``KVTransferConfig`` for the
    ``OffloadingConnector`` and a real ``KVEventsConfig`` when events are on.
    Takes :func:`kvexplore.offload_config`'s keywords.
    """
    from vllm.config import KVTransferConfig
    from vllm.config.kv_events import KVEventsConfig

    extra = kw.pop("extra_config", None)
    engine_id = kw.pop("engine_id", DEFAULT_ENGINE_ID)
    events = kw.pop("enable_kv_cache_events", False)
    v2 = kw.pop("use_v2_model_runner", False)
    if parallel_config is None:
        parallel_config = vllm_parallel_config(plan, **kw)
    vc = plan.vllm_config
    stand_in = VllmConfigStandIn(
        model_config=vc.model_config,
        cache_config=vc.cache_config,
        parallel_config=parallel_config,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id=engine_id,
            kv_connector_extra_config=dict(extra or {}),
        ),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True) if events else None,
        use_v2_model_runner=v2,
    )
    return stand_in, plan.kv_cache_config


def offload_cli_table(result) -> str:
    """Plain-text table of every field: field, value, rule."""
    return result.table().to_string(index=False, max_colwidth=120)
