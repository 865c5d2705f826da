"""vLLM's own path to a block size, for conformance tests and benchmarks.

This is deliberately *not* the planner: it builds a fresh
``vllm.config.ModelConfig`` from a config directory every call, puts it with a
fresh ``CacheConfig`` / ``ParallelConfig`` into a stand-in ``VllmConfig`` (the
fields the block-size hooks read), runs ``VllmConfig.try_verify_and_update_config`` and then
``Platform.update_block_size_for_backend`` with ``_find_non_ssm_backends``
patched (``unittest.mock``) to return the backend.  What it returns is what
the installed vLLM computes; the planner must agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock


@dataclass(frozen=True)
class ReferenceAlignment:
    block_size: int
    mamba_page_size_padded: int | None
    mamba_block_size: int | None
    mamba_cache_mode: str
    mamba_ssm_cache_dtype: str


def vllm_alignment(
    config_dir: str,
    *,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    enable_prefix_caching: bool = True,
    mamba_cache_mode: str | None = None,
    block_size: int | None = None,
    backend_name: str = "FLASH_ATTN",
) -> ReferenceAlignment:
    """Block size and Mamba padding as the installed vLLM computes them (slow path)."""
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    mc = ModelConfig(model=config_dir, tokenizer=config_dir, skip_tokenizer_init=True)
    pc = ParallelConfig(tensor_parallel_size=tensor_parallel_size)
    mc.verify_with_parallel_config(pc)
    kwargs = dict(cache_dtype=kv_cache_dtype, enable_prefix_caching=enable_prefix_caching)
    if mamba_cache_mode is not None:
        kwargs["mamba_cache_mode"] = mamba_cache_mode
    if block_size is not None:
        kwargs["block_size"] = block_size
    cc = CacheConfig(**kwargs)
    ns = SimpleNamespace
    stand_in = ns(
        model_config=mc,
        cache_config=cc,
        parallel_config=pc,
        speculative_config=None,
        num_speculative_tokens=0,
        scheduler_config=ns(enable_chunked_prefill=True, disable_hybrid_kv_cache_manager=False),
        load_config=ns(load_format="auto"),
        compilation_config=ns(
            static_forward_context={},
            cudagraph_capture_sizes=None,
            max_cudagraph_capture_size=None,
        ),
        structured_outputs_config=ns(reasoning_parser=""),
    )
    # a release whose Mamba state alignment asks the config for its SSM backend
    # (vLLM 0.34: ReplaySSM on FlashInfer only with use_replayssm, off by default)
    if isinstance(getattr(VllmConfig, "use_flashinfer_replayssm", None), property):
        stand_in.use_flashinfer_replayssm = bool(getattr(cc, "use_replayssm", False))
    VllmConfig.try_verify_and_update_config(stand_in)
    backend = AttentionBackendEnum[backend_name].get_class()
    with mock.patch.object(
        Platform, "_find_non_ssm_backends", classmethod(lambda cls, v: [backend])
    ):
        Platform.update_block_size_for_backend(stand_in)
    return ReferenceAlignment(
        block_size=cc.block_size,
        mamba_page_size_padded=cc.mamba_page_size_padded,
        mamba_block_size=cc.mamba_block_size,
        mamba_cache_mode=cc.mamba_cache_mode,
        mamba_ssm_cache_dtype=cc.mamba_ssm_cache_dtype,
    )


def qwen35_hand_block_size(gpu: str) -> int:
    """Qwen3.5-0.8B's block size by hand: a 1,085,440-byte GDN state page
    against 2,048 attention bytes per token, aligned to ``k = max(16, the
    installed release's CacheConfig.DEFAULT_BLOCK_SIZE)``, and on SM 9.0
    (FlashInfer GDN prefill) to 64-token checkpoints where the release's
    Mamba layers export them (``get_mamba_prefill_checkpoint_alignment``)."""
    import math

    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.mamba import abstract

    k = max(16, CacheConfig.DEFAULT_BLOCK_SIZE)
    if gpu in ("H100", "H200") and hasattr(abstract, "get_mamba_prefill_checkpoint_alignment"):
        k = math.lcm(k, 64)
    return k * math.ceil(1085440 / (k * 2048))
