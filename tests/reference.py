"""vLLM's own path to a block size, for conformance tests and benchmarks.

This is deliberately *not* the planner: it builds a fresh
``vllm.config.ModelConfig`` from a config directory every call, puts it with a
fresh ``CacheConfig`` / ``ParallelConfig`` into a stand-in ``VllmConfig`` (the
fields the block-size hooks read), runs ``VllmConfig.try_verify_and_update_config`` and then
``Platform.update_block_size_for_backend`` with ``_find_non_ssm_backends``
patched (``unittest.mock``) to return the backend.  What it returns is what
the installed vLLM computes; the planner must agree with it.

The stand-in builds no layer, so the one fact a built layer adds to the block
size, the prefill checkpoint alignment of Gated-DeltaNet layers in ``align``
mode (``get_mamba_prefill_checkpoint_alignment``), is put in by hand: a
stand-in Mamba layer declares ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`` when the
config has Gated-DeltaNet layers (``linear_attention`` layers with a
``linear_key_head_dim``) and vLLM's own
``_resolve_gdn_prefill_backend`` picks FlashInfer on a hand-written CUDA
platform of the GPU's compute capability (:data:`CAPABILITY`).
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
    gpu: str | None = None,
) -> ReferenceAlignment:
    """Block size and Mamba padding as the installed vLLM computes them (slow
    path); with ``gpu`` (a key of :data:`CAPABILITY`) the GDN prefill
    checkpoint alignment that GPU's layers declare is included."""
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
    if gpu is not None:
        stand_in.compilation_config.static_forward_context.update(
            _checkpointing_layers(stand_in, CAPABILITY[gpu]))
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


#: Compute capability of each GPU by name, from NVIDIA's CUDA GPU table.
CAPABILITY = {
    "A100": (8, 0), "A10G": (8, 6), "RTX 3090": (8, 6), "L4": (8, 9), "L40S": (8, 9),
    "RTX 4090": (8, 9), "H100": (9, 0), "H200": (9, 0), "B200": (10, 0),
    "RTX 5090": (12, 0), "RTX PRO 6000": (12, 0),
}


def _cuda_platform(capability: tuple[int, int]) -> SimpleNamespace:
    """The platform queries ``_resolve_gdn_prefill_backend`` makes, answered as
    a CUDA 13 device of ``capability`` does."""
    major, minor = capability
    return SimpleNamespace(
        is_xpu=lambda: False, is_rocm=lambda: False, is_cuda=lambda: True, is_cpu=lambda: False,
        device_name="cuda",
        is_device_capability=lambda c: c == major * 10 + minor,
        is_device_capability_family=lambda c: c // 10 == major,
        get_cuda_runtime_major=lambda: 13,
    )


def _checkpointing_layers(stand_in, capability: tuple[int, int]) -> dict:
    """One stand-in Mamba layer declaring the GDN prefill checkpoint alignment
    where the installed vLLM has one and would choose FlashInfer's GDN prefill
    (``align`` mode, Gated-DeltaNet layers in the config); else none."""
    from vllm.model_executor.layers.mamba import abstract

    if not hasattr(abstract, "get_mamba_prefill_checkpoint_alignment"):
        return {}
    if stand_in.cache_config.mamba_cache_mode != "align":
        return {}
    text = stand_in.model_config.hf_text_config
    gated_delta_net = ("linear_attention" in (getattr(text, "layer_types", None) or [])
                       and getattr(text, "linear_key_head_dim", None) is not None)
    if not gated_delta_net:
        return {}
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

    stand_in.additional_config = {}
    with mock.patch.object(gdn, "current_platform", _cuda_platform(capability)):
        _, chosen = gdn._resolve_gdn_prefill_backend(stand_in)
    if chosen != "flashinfer":
        return {}

    class Checkpointing(abstract.MambaBase):
        def get_prefill_checkpoint_alignment(self):
            return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

    Checkpointing.__abstractmethods__ = frozenset()  # never built: only asked its alignment
    return {"stand_in.linear_attn": object.__new__(Checkpointing)}


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
