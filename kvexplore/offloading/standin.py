"""A light stand-in for ``vllm.config.VllmConfig``, so vLLM's own functions run.

vLLM's planning code (``Platform.update_block_size_for_backend``,
``get_kv_cache_groups``, ``get_kv_cache_configs``, ``build_offloading_config``,
the per-model config hooks in ``vllm/model_executor/models/config.py``) reads a
handful of attributes of a ``VllmConfig``.  Building a real one needs a device
and runs far more machinery; :class:`VllmConfigStandIn` carries vLLM's *real*
``ModelConfig``, ``CacheConfig`` and ``ParallelConfig`` plus the few other
sub-configs those functions touch (GUIDE section 5).

The offloading derivation (:mod:`kvexplore.offloading.config`) uses it to hand vLLM's
``build_offloading_config`` a plan's real sub-configs with the parallel and
KV-transfer configs an offloading deployment adds.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from vllm.config import VllmConfig


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
    shared (building one costs milliseconds)."""
    return _cached_scheduler_config(model_config.max_model_len, model_config.is_encoder_decoder)


@lru_cache(maxsize=64)
def _cached_scheduler_config(max_model_len: int, is_encoder_decoder: bool):
    from vllm.config import SchedulerConfig

    return SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=is_encoder_decoder)
