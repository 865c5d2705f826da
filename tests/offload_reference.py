"""vLLM's own inputs for ``build_offloading_config``: what the offloading
conformance test and benchmark hand vLLM to compare kvexplore against.

A test module, not library code: it builds real ``ParallelConfig`` /
``KVTransferConfig`` / ``KVEventsConfig`` objects and sets the ``RANK``
environment variable ``external_launcher`` reads while one is built.

vLLM's functions read a handful of attributes of a ``VllmConfig``; building a
real one needs a device and runs far more machinery, so
:class:`VllmConfigStandIn` carries vLLM's *real* ``ModelConfig``,
``CacheConfig`` and ``ParallelConfig`` plus the few other sub-configs those
functions touch.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from vllm.config import VllmConfig

from kvexplore.errors import KVExploreError
from kvexplore.offloading.options import DEFAULT_ENGINE_ID


class VllmConfigStandIn(SimpleNamespace):
    """The attributes of ``VllmConfig`` that vLLM's planning functions read.

    The scheduler side is vLLM's own ``SchedulerConfig`` with its defaults
    (2,048 batched tokens, chunked prefill on, no async scheduling);
    ``max_concurrent_batches`` and ``max_in_flight_tokens`` are
    ``VllmConfig``'s own properties, which sliding-window specs read when they
    size their memory (``SlidingWindowSpec.max_memory_usage_bytes``).
    """

    max_concurrent_batches = VllmConfig.max_concurrent_batches
    max_in_flight_tokens = VllmConfig.max_in_flight_tokens

    def __copy__(self):
        # a plan hands out copies of its config; SimpleNamespace's own copy
        # would call __init__ without the required keywords
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __init__(
        self,
        *,
        model_config,
        cache_config,
        parallel_config,
        attention_backends=(),
        kv_transfer_config=None,
        kv_events_config=None,
        use_v2_model_runner: bool = False,
        **extra: Any,
    ) -> None:
        super().__init__(
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=parallel_config,
            attention_backends=tuple(attention_backends),
            speculative_config=None,
            num_speculative_tokens=0,
            num_prefill_lookahead_tokens=0,
            scheduler_config=_scheduler_config(model_config),
            load_config=SimpleNamespace(load_format="auto"),
            compilation_config=SimpleNamespace(
                static_forward_context={},
                cudagraph_capture_sizes=None,
                max_cudagraph_capture_size=None,
            ),
            attention_config=SimpleNamespace(hisparse_config=None),
            structured_outputs_config=SimpleNamespace(reasoning_parser=""),
            kv_transfer_config=kv_transfer_config,
            kv_events_config=kv_events_config,
            use_v2_model_runner=use_v2_model_runner,
            **extra,
        )

    def __repr__(self) -> str:  # keep reprs short in notebooks
        return (
            f"VllmConfigStandIn(model={self.model_config.model!r}, "
            f"tp={self.parallel_config.tensor_parallel_size}, "
            f"block_size={self.cache_config.block_size})"
        )


def _scheduler_config(model_config):
    """vLLM's ``SchedulerConfig`` with its defaults, for this model's length.

    Planning only reads it, so one instance per (length, encoder-decoder) is
    shared."""
    return _cached_scheduler_config(model_config.max_model_len, model_config.is_encoder_decoder)


@lru_cache(maxsize=64)
def _cached_scheduler_config(max_model_len: int, is_encoder_decoder: bool):
    from vllm.config import SchedulerConfig

    return SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=is_encoder_decoder)


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
    prefill_context_parallel_size: int = 1,
    data_parallel_rank: int = 0,
    distributed_executor_backend: str | None = "mp",
    nnodes_within_dp: int = 1,
    rank: int = 0,
):
    """A real ``vllm.config.ParallelConfig`` for these inputs at the plan's
    TP, PP, DP and DCP (read from the plan's own vLLM ``ParallelConfig``).

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
    pipeline_parallel_size = pc_plan.pipeline_parallel_size
    data_parallel_size = pc_plan.data_parallel_size
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

    The stand-in (:class:`VllmConfigStandIn`) carries the
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
