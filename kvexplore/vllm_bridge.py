"""A light stand-in for ``vllm.config.VllmConfig``, so vLLM's own functions run.

vLLM's planning code (``Platform.update_block_size_for_backend``,
``get_kv_cache_groups``, ``get_kv_cache_configs``, ``build_offloading_config``,
the per-model config hooks in ``vllm/model_executor/models/config.py``) reads a
handful of attributes of a ``VllmConfig``.  Building a real one needs a device
and runs far more machinery; :class:`VllmConfigStandIn` carries vLLM's *real*
``ModelConfig``, ``CacheConfig`` and ``ParallelConfig`` plus the few other
sub-configs those functions touch (GUIDE section 5).

:class:`OfflinePlatform` is vLLM's ``Platform`` with one change:
``_find_non_ssm_backends`` returns the backend chosen for the plan instead of
walking instantiated attention layers (there are none offline).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vllm.platforms.interface import Platform


class OfflinePlatform(Platform):
    """vLLM's base ``Platform`` with the attention backends given, not discovered."""

    @classmethod
    def _find_non_ssm_backends(cls, vllm_config):  # noqa: D401 - mirrors vLLM
        return list(getattr(vllm_config, "attention_backends", []))


class VllmConfigStandIn(SimpleNamespace):
    """The attributes of ``VllmConfig`` that vLLM's planning functions read."""

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
            scheduler_config=SimpleNamespace(
                enable_chunked_prefill=True,
                disable_hybrid_kv_cache_manager=False,
                max_num_batched_tokens=8192,
                max_num_seqs=256,
            ),
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


def run_model_hooks(vllm_config: VllmConfigStandIn) -> None:
    """Run vLLM's per-model config hooks, as ``VllmConfig.__post_init__`` does.

    ``VllmConfig.try_verify_and_update_config`` guards itself with
    ``model_config.config_updated``; the cached ``ModelConfig`` is shared by
    many plans, so the guard is reset before each run (the hooks that touch
    the model config are idempotent).
    """
    from vllm.config import VllmConfig

    vllm_config.model_config.config_updated = False
    VllmConfig.try_verify_and_update_config(vllm_config)
