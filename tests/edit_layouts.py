"""Synthetic registrations for the edit / round-trip tests.

Legacy (vLLM < 0.26): attention ``[kernel_pages, 2, kernel_block, heads, head]``
contiguous; Mamba ``[conv, ssm]`` views into one padded page per block.
Unified (vLLM 0.33): vLLM's own ``create_kv_cache_views``.
"""

from __future__ import annotations

import math

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

QWEN_PAGE = 1_114_112


def qwen_gdn(mode: str = "align") -> MambaSpec:
    return MambaSpec(
        block_size=544,
        shapes=((3, 6144), (16, 128, 128)),
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=QWEN_PAGE,
        mamba_cache_mode=mode,
    )


def qwen_attn() -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=544, num_kv_heads=2, head_size=256, dtype=torch.bfloat16
    )


def elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def legacy_attention(spec, num_blocks, kernel, device="cpu", raw=None):
    ratio = spec.block_size // kernel
    shape = (num_blocks * ratio, 2, kernel, spec.num_kv_heads, spec.head_size)
    if raw is None:
        return torch.zeros(shape, dtype=spec.dtype, device=device)
    return raw[: math.prod(shape) * elem(spec.dtype)].view(spec.dtype).view(shape)


def legacy_mamba(spec, num_blocks, device="cpu", raw=None, base_pages=0):
    page = spec.page_size_bytes
    if raw is None:
        raw = torch.zeros(
            page * (num_blocks + base_pages), dtype=torch.int8, device=device
        )
    states, cursor = [], base_pages * page
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        size = elem(dtype)
        assert page % size == 0 and cursor % size == 0
        inner = [1]
        for n in reversed(shape[1:]):
            inner.insert(0, inner[0] * n)
        typed = raw.view(dtype)
        states.append(
            typed.as_strided(
                (num_blocks, *shape), (page // size, *inner), cursor // size
            )
        )
        cursor += math.prod(shape) * size
    return states


def config(groups, num_blocks, tensors=(), layout=None):
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=list(tensors),
        kv_cache_groups=[KVCacheGroupSpec(list(n), s) for n, s in groups],
        kv_cache_layout=layout,
    )


def legacy_registration(groups, num_blocks, kernel=None, device="cpu"):
    """One buffer per layer (vLLM < 0.26: page x num_blocks each)."""
    caches = {}
    for names, spec in groups:
        for name in names:
            if isinstance(spec, MambaSpec):
                caches[name] = legacy_mamba(spec, num_blocks, device)
            else:
                caches[name] = legacy_attention(
                    spec, num_blocks, kernel or spec.block_size, device
                )
    return config(groups, num_blocks), caches


def unified_registration(
    groups, num_blocks, layout=KVCacheLayout.LBNHC, kernel=None, device="cpu"
):
    """Groups overlaid on one allocation, layer-compact, via vLLM itself."""
    page = max(s.page_size_bytes for _, s in groups)
    width = max(len(n) for n, _ in groups)
    raw = torch.zeros(page * num_blocks * width, dtype=torch.int8, device=device)
    caches, tensors = {}, []
    for names, spec in groups:
        if layout.is_layer_compact:
            layer_stride, block_stride = page * num_blocks, page
        else:
            layer_stride, block_stride = page, page * width
        kt = KVCacheTensor(
            size=raw.numel(),
            layers=list(names),
            layer_stride=layer_stride,
            block_stride=block_stride,
        )
        tensors.append(kt)
        kb = kernel if (kernel and not isinstance(spec, MambaSpec)) else None
        views = create_kv_cache_views(raw, spec, num_blocks, layout, kt, kb)
        caches.update(zip(names, views, strict=True))
    return config(groups, num_blocks, tensors, layout.name), caches


def qwen_groups(layers_per_group=6):
    out = []
    for g in range(4):
        spec = qwen_attn() if g == 3 else qwen_gdn()
        out.append(([f"model.layers.{g}.{i}" for i in range(layers_per_group)], spec))
    return out


def facts(kv_caches):
    """Everything about a registration that must stay untouched."""
    out = {}
    for name, value in kv_caches.items():
        if isinstance(value, torch.Tensor):
            tensors = [value]
        elif isinstance(value, (list, tuple)):
            tensors = list(value)
        else:
            out[name] = (id(value), type(value))
            continue
        out[name] = (
            id(value),
            type(value),
            len(tensors),
            [
                (id(t), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)
                for t in tensors
            ],
        )
    return list(kv_caches), out


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte of ``t`` in its untyped storage."""
    size = t.element_size()
    lo = t.storage_offset()
    hi = lo + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return lo * size, (hi + 1) * size


def storages(caches):
    """The distinct untyped storages behind a registration."""
    seen = {}
    for value in caches.values():
        for t in [value] if isinstance(value, torch.Tensor) else value:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage()
    return list(seen.values())


def storage_bytes(caches):
    """Every storage behind ``caches`` as a flat uint8 tensor (a view)."""
    return [
        torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
        for s in storages(caches)
    ]


def snapshot(caches):
    """A copy of every byte behind ``caches``."""
    return [raw.clone() for raw in storage_bytes(caches)]


def same(before, after) -> bool:
    """Whether two :func:`snapshot` lists hold the same bytes."""
    return all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def randomize(caches, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for raw in storage_bytes(caches):
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
