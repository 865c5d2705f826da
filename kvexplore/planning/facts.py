"""What a plan reads of vLLM's objects, as frozen facts.

:class:`GroupInfo` and :class:`TensorInfo` are a ``KVCacheConfig``'s groups and
tensors (``vllm/v1/kv_cache_interface.py``), the groups with the kernel block
and backend the worker picks; the functions read the configs, specs and
backends of a build (:class:`kvexplore.planning.worker.BuiltModel`) into the
plain values a :class:`~kvexplore.planning.planner.Plan` holds.  Each reads,
none changes, what it is given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvexplore.layout import leaf_specs, page_bytes, real_page_bytes
from kvexplore.planning.models import CROSS, FULL, MAMBA, MLA, SLIDING


@dataclass(frozen=True)
class GroupInfo:
    """One KV cache group as the engine core builds it (vLLM's
    ``KVCacheGroupSpec``), with the kernel block and backend the worker picks.

    ``kv_cache_spec`` is vLLM's spec (a frozen dataclass); for a
    ``UniformTypeKVCacheSpecs`` group :attr:`spec` is its first layer's.
    """

    index: int
    layer_names: tuple[str, ...]
    kv_cache_spec: Any
    kernel_block_size: int
    backend: str | None
    enable_kv_transfer: bool = True
    is_eagle_group: bool = False

    @property
    def spec(self):
        """The first leaf spec (the group's own for a plain spec)."""
        return leaf_specs(self.kv_cache_spec)[0]

    @property
    def kind(self) -> str:
        """vLLM's ``get_kv_cache_spec_kind`` value (``"mamba"``, ``"full_attention"``, ...)."""
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        return get_kv_cache_spec_kind(self.spec).value

    @property
    def page_bytes(self) -> int:
        return page_bytes(self.spec)

    @property
    def real_page_bytes(self) -> int:
        return real_page_bytes(self.spec)


@dataclass(frozen=True)
class TensorInfo:
    """One ``KVCacheTensor``: placement of ``layers`` in the backing allocation
    (layer ``l``'s page of block ``b`` at ``offset + l * layer_stride + b *
    block_stride`` bytes)."""

    size: int
    layers: tuple[str, ...]
    layer_stride: int
    block_stride: int
    offset: int = 0


def spec_dtypes(spec) -> str:
    dtypes = getattr(spec, "dtypes", None)
    if dtypes is not None:
        return "/".join(str(d).removeprefix("torch.") for d in dtypes)
    return str(getattr(spec, "dtype", "")).removeprefix("torch.")


def mixer(spec) -> str | None:
    """A Mamba spec's ``mamba_type`` in lower case (``"short_conv"``), else None."""
    mamba_type = getattr(spec, "mamba_type", None)
    return str(getattr(mamba_type, "name", mamba_type)).lower() if mamba_type else None


def layer_kind(spec) -> str:
    """The kind of a layer's ``KVCacheSpec``: ``mamba``, ``mla_attention``,
    ``cross_attention``, ``sliding_window``, ``full_attention``, or vLLM's own
    spec-kind name for the rarer specs."""
    from vllm.v1.kv_cache_interface import (
        CrossAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_cache_spec_kind,
    )

    for cls, kind in (
        (MambaSpec, MAMBA),
        (MLAAttentionSpec, MLA),
        (CrossAttentionSpec, CROSS),
        (SlidingWindowSpec, SLIDING),
        (FullAttentionSpec, FULL),
    ):
        if isinstance(spec, cls):
            return kind
    return get_kv_cache_spec_kind(spec).value


def kernel_block_sizes(kv_cache_config, built) -> list[int]:
    """``prepare_kernel_block_sizes`` with every group's own layer backends."""
    from types import SimpleNamespace

    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    from kvexplore.planning.emulation import emulate

    attn_groups = []
    for g in kv_cache_config.kv_cache_groups:
        by_backend: dict = {}
        for name in g.layer_names:
            backend = built.backends.get(name)
            if backend is not None and backend not in by_backend:
                by_backend[backend] = SimpleNamespace(
                    backend=backend, kv_cache_spec=built.layer_specs[name]
                )
        attn_groups.append(list(by_backend.values()))
    with emulate(built.gpu, meta_tensors=False):
        return prepare_kernel_block_sizes(kv_cache_config, attn_groups)


def attention_page_per_token(vc, backend) -> int:
    """Bytes of one token of one attention layer, as ``_align_hybrid_block_size``
    computes it (``customize_spec`` of a 1-token ``FullAttentionSpec``; MLA:
    a 1-token ``MLAAttentionSpec``)."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )

    mc, pc, cc = vc.model_config, vc.parallel_config, vc.cache_config
    dtype = kv_cache_dtype_str_to_dtype(cc.cache_dtype, mc)
    quant = get_kv_quant_mode(cc.cache_dtype)
    if mc.use_mla:
        return MLAAttentionSpec(
            block_size=1, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(),
            dtype=dtype, cache_dtype_str=cc.cache_dtype, kv_quant_mode=quant,
        ).page_size_bytes
    spec = FullAttentionSpec(
        block_size=1, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(),
        dtype=dtype, kv_quant_mode=quant,
    )
    with set_current_vllm_config(vc):
        return backend.customize_spec(spec).page_size_bytes


def group_infos(cfg, kernel_block_sizes, built) -> tuple[GroupInfo, ...]:
    out = []
    for gid, g in enumerate(cfg.kv_cache_groups):
        backend = built.backends.get(g.layer_names[0]) if g.layer_names else None
        out.append(GroupInfo(
            index=gid, layer_names=tuple(g.layer_names), kv_cache_spec=g.kv_cache_spec,
            kernel_block_size=int(kernel_block_sizes[gid]),
            backend=backend.get_name() if backend is not None else None,
            enable_kv_transfer=bool(g.enable_kv_transfer), is_eagle_group=bool(g.is_eagle_group),
        ))
    return tuple(out)


def layout_facts(vc, built) -> dict[str, Any]:
    """The cache's page sizes and the attention backend, read from the build."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    specs = built.layer_specs
    backend = next((built.backends[n] for n, s in specs.items()
                    if isinstance(s, AttentionSpec) and n in built.backends), None)
    mamba = next((s for s in specs.values() if isinstance(s, MambaSpec)), None)
    return {
        "backend": backend,
        "mamba_page_size": (dataclasses.replace(mamba, page_size_padded=None).page_size_bytes
                            if mamba else None),
        "attention_page_bytes_per_token": (attention_page_per_token(vc, backend)
                                           if backend else None),
    }


def config_facts(vc, built) -> dict[str, Any]:
    """What the plan reads of vLLM's configs, once."""
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    return {
        "tensor_parallel_size": int(pc.tensor_parallel_size),
        "decode_context_parallel_size": int(pc.decode_context_parallel_size),
        "pipeline_parallel_size": int(pc.pipeline_parallel_size),
        "pipeline_parallel_rank": int(built.pipeline_rank),
        "kv_cache_dtype": str(cc.cache_dtype),
        "model_dtype": str(mc.dtype).removeprefix("torch."),
        "mamba_ssm_cache_dtype": str(cc.mamba_ssm_cache_dtype),
        "mamba_cache_mode": str(cc.mamba_cache_mode),
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "mamba_page_size_padded": cc.mamba_page_size_padded,
        "kv_cache_layout": cc.get_resolved_kv_cache_layout(),
        "kv_cache_layout_name": str(cc.kv_cache_layout),
        "prefix_match_unit": cc.prefix_match_unit,
        "block_size": int(cc.block_size),
        "max_model_len": int(mc.max_model_len),
        "model_max_model_len": int(built.vllm_config.model_config.max_model_len),
        "served_model": str(mc.model),
        "use_mla": bool(mc.use_mla),
        "total_num_kv_heads": int(mc.get_total_num_kv_heads()),
        "num_kv_heads": int(mc.get_num_kv_heads(pc)),
        "head_size": int(mc.get_head_size()),
        "mla_dims": mla_dims(mc),
    }


def mla_dims(mc) -> tuple[int, int] | None:
    """``(kv_lora_rank, qk_rope_head_dim)`` of an MLA model's text config."""
    hf = mc.hf_text_config
    rank, rope = getattr(hf, "kv_lora_rank", None), getattr(hf, "qk_rope_head_dim", None)
    return (int(rank), int(rope)) if mc.use_mla and rank and rope else None


__all__ = [
    "GroupInfo",
    "TensorInfo",
    "attention_page_per_token",
    "config_facts",
    "group_infos",
    "kernel_block_sizes",
    "layer_kind",
    "layout_facts",
    "mixer",
    "spec_dtypes",
]
