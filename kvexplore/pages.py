"""The page model: one layer's registered KV cache as page segments and byte views.

Every stage that needs a page's segments or byte views reads them here (a
spec's page size itself is :func:`kvexplore.layout.page_bytes` /
:func:`~kvexplore.layout.real_page_bytes`, below the planner): the page maps
(:mod:`kvexplore.rendering.layouts`), the round-trip proof's regions
(:mod:`kvexplore.editing.proof`) and the cross-release page facts
(:func:`page_facts`, what :func:`kvexplore.versions.deployment_facts`
reports).  The inputs are vLLM's own objects: the layer's ``KVCacheSpec``
(the plan's ``layer_specs``) and the value a KV connector's
``register_kv_caches`` receives for it (:func:`kvexplore.registration.allocate`:
vLLM's ``allocate_kv_cache`` / ``create_kv_cache_views`` for ``unified``,
kvexplore's legacy views for ``legacy``).  Nothing is allocated or copied:
the results are byte offsets and view recipes.

* :func:`mamba_states` -- a Mamba page's states packed in ``MambaSpec.shapes``
  order (``conv | ssm``), as ``MambaBase.bind_kv_cache`` unpacks the unified row;
* :func:`kv_halves` -- the K and V bytes of a unified attention cell
  ``C = K | V`` (``AttentionSpec.head_size`` / ``head_size_v``);
* :func:`describe_page` -- the page of block 0 as :class:`Segment` s covering
  ``[0, page_size_bytes)`` (``conv | ssm | pad``, ``K|V`` per kernel page,
  ``K`` / ``V`` per kernel page for the legacy ``[pages, 2, kernel_block, H,
  D]`` tensor, ``latent`` for MLA), kernel page 0's cells, and the registered
  views as :class:`ViewRecipe` s;
* :func:`page_regions` -- the named parts of a layer's registered bytes as
  ``uint8 [num_blocks, kernel_pages, ...]`` views (``conv`` / ``ssm``, ``K`` /
  ``V``, ``kv``, ``latent``, ``state``);
* :func:`page_facts` -- per KV cache group of a plan, the first layer's page as
  JSON data.

A page the model cannot describe raises :class:`~kvexplore.errors.KVExploreError`
naming what is missing; a caller that shows "no layout" decides so itself.

>>> import torch
>>> from vllm.v1.kv_cache_interface import MambaSpec
>>> spec = MambaSpec(block_size=544, shapes=((3, 6144), (16, 128, 128)),
...                  dtypes=(torch.bfloat16, torch.float32), page_size_padded=1114112)
>>> [(s.label, s.start, s.size) for s in mamba_states(spec)]
[('conv', 0, 36864), ('ssm', 36864, 1048576)]
>>> row = torch.empty(4 * 1114112, dtype=torch.int8, device="meta")
>>> row = row.as_strided((4, 1, 1, 1085440), (1114112, 1085440, 1085440, 1))
>>> page = describe_page(spec, row)
>>> [(s.label, s.start, s.size) for s in page.segments]
[('conv', 0, 36864), ('ssm', 36864, 1048576), ('pad', 1085440, 28672)]
>>> [(label, tuple(v.shape), v.storage_offset()) for label, v in page_regions(spec, row, 4)]
[('conv', (4, 1, 1, 1, 36864), 0), ('ssm', (4, 1, 1, 1, 1048576), 36864)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.kv_cache_interface import (
    KVCacheSpecKind,
    MambaSpec,
    MLAAttentionSpec,
    get_kv_cache_spec_kind,
)

from kvexplore.errors import KVExploreError
from kvexplore.layout import (
    dtype_name,
    element_size,
    page_bytes,
    real_page_bytes,
    state_names,
)

#: Cells of kernel page 0 a page map lists.
MAX_CELLS = 8


@dataclass(frozen=True)
class Segment:
    """One contiguous byte run ``[start, start + size)`` of a page or buffer:
    ``label`` a vLLM / LMCache word (``conv``, ``K|V p3``, ...), ``detail``
    what the bytes hold."""

    label: str
    start: int
    size: int
    dtype: str = ""
    detail: str = ""
    kernel_page: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def kind(self) -> str:
        """The label without the kernel-page suffix (``'K|V p3'`` -> ``'K|V'``)."""
        return self.label.split(" ")[0]


@dataclass(frozen=True)
class ViewRecipe:
    """A strided view as data: ``shape`` and ``stride`` in elements of
    ``dtype``, ``storage_offset`` in elements from the storage's first byte."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: str

    @classmethod
    def of(cls, t: torch.Tensor) -> ViewRecipe:
        """The recipe of tensor ``t``."""
        return cls(
            tuple(t.shape),
            tuple(t.stride()),
            int(t.storage_offset()),
            dtype_name(t.dtype),
        )

    @property
    def element_size(self) -> int:
        return element_size(getattr(torch, self.dtype))

    def text(self) -> str:
        """``'[64, 1, 1, 1085440] int8, strides (1114112, 1085440, 1085440, 1),
        storage offset 0 B'``."""
        return (
            f"{list(self.shape)} {self.dtype}, strides {self.stride}, "
            f"storage offset {self.storage_offset * self.element_size:,} B"
        )


@dataclass(frozen=True)
class PageMap:
    """One layer's page of block 0: ``segments`` cover ``[0, page_bytes)`` in
    byte order (``gap`` where a layout splits a block's page, ``pad`` for the
    page's padding); ``cells`` zoom into kernel page 0 in memory order;
    ``views`` are the registered tensors; ``kernel_block_size`` the tokens
    of one kernel page (the block size for a Mamba spec); ``block_stride`` is the bytes from
    one block's page to the next's, ``start`` the first page's byte offset in
    its storage."""

    page_bytes: int
    real_bytes: int
    kernel_block_size: int
    kernel_pages: int
    segments: tuple[Segment, ...]
    cells: tuple[Segment, ...]
    cells_note: str
    views: tuple[ViewRecipe, ...]
    start: int
    block_stride: int

    def page_offset(self, block: int) -> int:
        """Byte offset of block ``block``'s page in its storage."""
        return self.start + block * self.block_stride


def registered_tensors(
    value: Any, what: str = "the registered value"
) -> list[torch.Tensor]:
    """The tensors of one registered value (a tensor, or a list / tuple of
    them); refused when it holds none or something else."""
    tensors = list(value) if isinstance(value, (list, tuple)) else [value]
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise KVExploreError(
            f"{what} is a {type(value).__name__}; expected a tensor or a list of tensors"
        )
    return tensors


def mamba_states(spec: MambaSpec) -> list[Segment]:
    """``conv | ssm``: the states packed from byte 0 in ``MambaSpec.shapes``
    order, each ``prod(shape) * dtype`` bytes (``MambaBase.bind_kv_cache``
    unpacks the unified row the same way)."""
    shapes, dtypes = getattr(spec, "shapes", None), getattr(spec, "dtypes", None)
    if not shapes or dtypes is None or len(dtypes) != len(shapes):
        raise KVExploreError(
            f"spec {type(spec).__name__} has shapes={shapes!r} and dtypes={dtypes!r}; "
            "expected one dtype per state shape (MambaSpec)"
        )
    segs: list[Segment] = []
    cursor = 0
    for label, shape, dtype in zip(
        state_names(len(shapes)), shapes, dtypes, strict=True
    ):
        size = math.prod(shape) * element_size(dtype)
        segs.append(Segment(label, cursor, size, dtype_name(dtype), f"{tuple(shape)}"))
        cursor += size
    return segs


def kv_halves(spec, cell_bytes: int, elem: int) -> tuple[int, int] | None:
    """``(K bytes, V bytes)`` of a unified attention cell of ``cell_bytes``
    bytes in elements of ``elem`` bytes: ``head_size`` and ``head_size_v``
    (``head_size`` where the spec has none) elements each, when they fill
    the cell exactly and the spec stores no other state
    (``state_content_bytes``); None when the cell is not ``K | V``."""
    head_k = int(getattr(spec, "head_size", 0) or 0)
    head_v = int(getattr(spec, "head_size_v", 0) or head_k)
    if not head_k or getattr(spec, "state_content_bytes", None) is not None:
        return None
    if (head_k + head_v) * elem != cell_bytes:
        return None
    return head_k * elem, head_v * elem


def is_legacy_attention(view: torch.Tensor) -> bool:
    """Whether ``view`` is a legacy ``[pages, 2, kernel_block, H, D]`` K/V tensor."""
    return view.ndim == 5 and view.shape[1] == 2


def describe_page(
    spec,
    value: Any,
    *,
    kernel_block_size: int | None = None,
    mla_dims: tuple[int, int] | None = None,
    max_cells: int = MAX_CELLS,
) -> PageMap:
    """The page of block 0 of one layer registered as ``value`` (see the
    module docstring), with ``spec.block_size // kernel_block_size`` kernel
    pages per block (one for a Mamba spec or without ``kernel_block_size``).
    ``mla_dims`` (``kv_lora_rank``, ``qk_rope_head_dim``) splits an MLA row
    into ``c_kv | k_pe``.  Refused (``KVExploreError``) for a value that is
    no tensor or list of tensors, a spec without ``page_size_bytes`` or
    ``block_size``, and a view whose rank the model does not know."""
    tensors = registered_tensors(value)
    page = page_bytes(spec)
    if not isinstance(getattr(spec, "block_size", None), int):
        raise KVExploreError(
            f"spec {type(spec).__name__} has no usable block_size "
            f"({getattr(spec, 'block_size', None)!r}); expected a vLLM KVCacheSpec"
        )
    if isinstance(spec, MambaSpec) or not kernel_block_size:
        kernel_block_size, ratio = int(spec.block_size), 1
    else:
        ratio = max(1, spec.block_size // kernel_block_size)
    first = tensors[0]
    if first.ndim == 0:
        raise KVExploreError(
            "the registered tensor is 0-D; expected a leading dim of kernel pages"
        )
    if isinstance(spec, MambaSpec):
        segs, cells, note = mamba_states(spec), [], ""
    elif isinstance(spec, MLAAttentionSpec):
        segs, cells, note = _mla_segments(spec, first, ratio, mla_dims, max_cells)
    elif is_legacy_attention(first):
        segs, cells, note = _legacy_attention_segments(first, ratio)
    elif first.ndim == 4:
        segs, cells, note = _unified_attention_segments(spec, first, ratio, max_cells)
    else:
        raise KVExploreError(
            f"a {type(spec).__name__} layer registered as a {first.ndim}-D tensor "
            f"{tuple(first.shape)}; expected [pages, H, N, C] (unified) or "
            "[pages, 2, kernel_block, H, D] (legacy)"
        )
    covered = max((s.end for s in segs), default=0)
    if covered < page:
        why = (
            "page padding: no state"
            if isinstance(spec, MambaSpec)
            else "page padding (page_size_padded)"
        )
        segs.append(Segment("pad", covered, page - covered, "", why))
    elem = first.element_size()
    return PageMap(
        page_bytes=page,
        real_bytes=real_page_bytes(spec),
        kernel_block_size=kernel_block_size,
        kernel_pages=ratio,
        segments=tuple(segs),
        cells=tuple(cells),
        cells_note=note,
        views=tuple(ViewRecipe.of(t) for t in tensors),
        start=first.storage_offset() * elem,
        block_stride=ratio * first.stride(0) * elem,
    )


def _unified_attention_segments(spec, view, ratio: int, max_cells: int):
    """``[P, H, N, C]`` (P = blocks x kernel pages): K|V side by side in ``C``."""
    elem = view.element_size()
    _, heads, tokens, c = view.shape
    s0, s_h, s_n, _ = (s * elem for s in view.stride())
    c_bytes = c * elem
    halves = kv_halves(spec, c_bytes, elem)
    k_bytes, v_bytes = halves or (0, 0)
    dtype = dtype_name(view.dtype)
    kp_extent = (heads - 1) * s_h + (tokens - 1) * s_n + c_bytes
    order = "token outside head" if s_n >= s_h else "head outside token"
    what = (
        f"[{tokens} tokens, {heads} heads] x (K {k_bytes} B | V {v_bytes} B)"
        if halves
        else f"[{tokens} tokens, {heads} heads] x {c_bytes} B"
    )
    label = "K|V" if halves else "kv"
    segs: list[Segment] = []
    if kp_extent == heads * tokens * c_bytes:
        for p in range(ratio):
            segs.append(Segment(f"{label} p{p}", p * s0, kp_extent, dtype, what, p))
    else:  # a head's rows are not next to each other: one run per (page, head)
        cursor = 0
        run_bytes = (tokens - 1) * s_n + c_bytes
        for start, p, h in sorted(
            (p * s0 + h * s_h, p, h) for p in range(ratio) for h in range(heads)
        ):
            if start > cursor:
                segs.append(
                    Segment("gap", cursor, start - cursor, "", "other blocks' bytes")
                )
            segs.append(
                Segment(
                    f"{label} p{p}", start, run_bytes, dtype, f"head {h}: {what}", p
                )
            )
            cursor = start + run_bytes
    cells: list[Segment] = []
    coords = sorted(
        (h * s_h + n * s_n, n, h)
        for n in range(min(tokens, max_cells))
        for h in range(min(heads, max_cells))
    )
    for off, n, h in coords[: max_cells // (2 if halves else 1)]:
        if halves:
            cells.append(
                Segment(
                    f"K t{n} h{h}", off, k_bytes, dtype, f"head_size {k_bytes // elem}"
                )
            )
            cells.append(
                Segment(
                    f"V t{n} h{h}",
                    off + k_bytes,
                    v_bytes,
                    dtype,
                    f"head_size_v {v_bytes // elem}",
                )
            )
        else:
            cells.append(Segment(f"{label} t{n} h{h}", off, c_bytes, dtype, ""))
    note = (
        f"C = {c_bytes} B per (token, head), {order}: token stride {s_n:,} B, head "
        f"stride {s_h:,} B; {tokens * heads} cells per kernel page"
    )
    return segs, cells, note


def _legacy_attention_segments(view, ratio: int):
    """``[pages, 2, kernel_block, H, D]``: K/V dim second, per kernel page."""
    elem = view.element_size()
    _, two, tokens, heads, head = view.shape
    s0, s_kv = view.stride(0) * elem, view.stride(1) * elem
    half = tokens * heads * head * elem
    dtype = dtype_name(view.dtype)
    segs: list[Segment] = []
    for p in range(ratio):
        for i, kv in enumerate("KV"[:two]):
            segs.append(
                Segment(
                    f"{kv} p{p}",
                    p * s0 + i * s_kv,
                    half,
                    dtype,
                    f"[{tokens} tokens, {heads} heads, {head}]",
                    p,
                )
            )
    cells = [
        Segment(
            "K t0-" + str(tokens - 1),
            0,
            half,
            dtype,
            f"all {tokens} tokens' K of kernel page 0",
        ),
        Segment(
            "V t0-" + str(tokens - 1),
            s_kv,
            half,
            dtype,
            f"all {tokens} tokens' V of kernel page 0",
        ),
    ]
    note = (
        f"K/V dim second: K [{tokens}, {heads}, {head}] then V; K/V stride {s_kv:,} B"
    )
    return segs, cells, note


def _mla_segments(spec, view, ratio: int, mla_dims, max_cells: int):
    """One latent row per token: ``c_kv`` (kv_lora_rank) | ``k_pe`` (rope dims)."""
    elem = view.element_size()
    head = int(spec.head_size)
    kernel_tokens = spec.block_size // ratio
    row = spec.page_size_bytes // spec.block_size
    kp = row * kernel_tokens
    dtype = dtype_name(view.dtype)
    rank, rope = mla_dims or (None, None)
    split = rank and rope and (rank + rope) == head and row == head * elem
    what = f"{kernel_tokens} tokens x {row} B" + (
        f" (c_kv {rank * elem} B | k_pe {rope * elem} B)"
        if split
        else " (packed latent)"
    )
    segs = [Segment(f"latent p{p}", p * kp, kp, dtype, what, p) for p in range(ratio)]
    cells: list[Segment] = []
    for n in range(min(kernel_tokens, max_cells // 2)):
        if split:
            cells.append(
                Segment(
                    f"c_kv t{n}", n * row, rank * elem, dtype, f"kv_lora_rank {rank}"
                )
            )
            cells.append(
                Segment(
                    f"k_pe t{n}",
                    n * row + rank * elem,
                    rope * elem,
                    dtype,
                    f"qk_rope_head_dim {rope}",
                )
            )
        else:
            cells.append(Segment(f"latent t{n}", n * row, row, dtype, ""))
    note = f"one latent row of {row} B per token (MLA: no separate K and V)"
    return segs, cells, note


def as_bytes(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` as ``uint8`` (a view; the last dim must be dense to split it)."""
    if t.dtype == torch.uint8:
        return t
    if t.element_size() == 1 or (t.ndim and t.stride(-1) == 1):
        return t.view(torch.uint8)
    raise KVExploreError(
        f"{what} (shape {tuple(t.shape)}, strides {tuple(t.stride())}) has a "
        "strided last dim; expected stride 1 there to address its bytes"
    )


def by_block(t: torch.Tensor, num_blocks: int, what: str) -> torch.Tensor:
    """``[num_blocks * r, ...]`` -> ``[num_blocks, r, ...]`` (a view)."""
    if t.ndim == 0 or num_blocks <= 0 or t.shape[0] % num_blocks:
        raise KVExploreError(
            f"{what} has shape {tuple(t.shape)}; expected a multiple of the "
            f"config's num_blocks={num_blocks} in dim 0"
        )
    return t.unflatten(0, (num_blocks, t.shape[0] // num_blocks))


def page_regions(
    spec, value: Any, num_blocks: int, name: str = "the layer"
) -> tuple[tuple[str, torch.Tensor], ...]:
    """Named byte views ``uint8 [num_blocks, kernel_pages, ...]`` of a
    layer's registered data (views of its storage, never copies).

    Legacy Mamba (a list): one region per state.  Unified Mamba: the row
    split at :func:`mamba_states` when they fill it, else one ``state``
    region.  Attention: ``K`` and ``V`` (the legacy K/V dim, or
    :func:`kv_halves` of the unified ``C`` dim), else one ``kv`` (``latent``
    for MLA) region.  Refused: a leading dim that is not whole blocks, and a
    strided last dim of a wider dtype (its bytes cannot be split).
    """
    what = f"layer {name!r}"
    if not isinstance(value, torch.Tensor):
        tensors = registered_tensors(value, what)
        return tuple(
            (label, as_bytes(by_block(t, num_blocks, what), name))
            for label, t in zip(state_names(len(tensors)), tensors, strict=True)
        )
    blocks = as_bytes(by_block(value, num_blocks, what), name)
    if isinstance(spec, MambaSpec):
        states = mamba_states(spec)
        if value.ndim == 4 and states[-1].end == blocks.shape[-1]:
            return tuple((s.label, blocks[..., s.start : s.end]) for s in states)
        return (("state", blocks),)
    if is_legacy_attention(value):
        return (("K", blocks[:, :, 0]), ("V", blocks[:, :, 1]))
    mla = _is_mla(spec)
    if value.ndim == 4 and not mla and getattr(spec, "head_size_v", 0):
        elem = value.element_size()
        dtype = getattr(spec, "dtype", None)
        halves = kv_halves(spec, value.shape[-1] * elem, elem)
        if halves and dtype is not None and element_size(dtype) == elem:
            k_bytes = halves[0]
            return (("K", blocks[..., :k_bytes]), ("V", blocks[..., k_bytes:]))
    return (("latent" if mla else "kv", blocks),)


def _is_mla(spec) -> bool:
    """Whether vLLM's kind of ``spec`` is MLA attention (False for a non-spec)."""
    try:
        return get_kv_cache_spec_kind(spec) == KVCacheSpecKind.MLA_ATTENTION
    except Exception:  # an object vLLM does not know as a spec
        return False


def group_label(plan, group) -> str:
    """``"g3 full_attention x7 (1 draft)"``: a group's kind, layers and the
    drafter's share of them."""
    drafts = sum(
        info.is_draft for info in plan.layers if info.name in group.layer_names
    )
    mixers = {
        info.mixer
        for info in plan.layers
        if info.name in group.layer_names and info.mixer
    }
    extra = [*sorted(mixers), *([f"{drafts} draft"] if drafts else [])]
    return f"g{group.index} {group.kind} x{len(group.layer_names)}" + (
        f" ({', '.join(extra)})" if extra else ""
    )


def group_of(plan, name: str) -> int:
    """The index of the KV cache group that holds layer ``name``."""
    for gid, group in enumerate(plan.groups):
        if name in group.layer_names:
            return gid
    raise KVExploreError(f"layer {name!r} is in no KV cache group of {plan.model.name}")


def layer_page(plan, name: str, registration: str = "unified") -> PageMap:
    """:func:`describe_page` of ``plan``'s layer ``name`` as ``registration``
    registers it (:func:`kvexplore.registration.registered_views`), with the
    group's kernel block size and the plan's MLA dims."""
    from kvexplore.registration import registered_views

    if name not in plan.layer_specs:
        raise KVExploreError(
            f"layer {name!r} is not a KV-cache layer of {plan.model.name}"
        )
    spec = plan.layer_specs[name]
    gid = group_of(plan, name)
    kernel = (
        spec.block_size if isinstance(spec, MambaSpec) else plan.kernel_block_sizes[gid]
    )
    return describe_page(
        spec,
        registered_views(plan, registration)[name],
        kernel_block_size=kernel,
        mla_dims=plan.mla_dims,
    )


def page_facts(plan) -> list[dict[str, Any]]:
    """Per KV cache group of ``plan``: the group's label
    (:func:`group_label`), its first layer, the page's bytes
    (``page_bytes``, ``real_bytes``), kernel pages per block and the page's
    segments as ``[label, start, size, dtype]`` (JSON data), for the
    ``unified`` registration.  A plan without blocks is described by one
    block of the same layout.  A page that cannot be described raises
    ``KVExploreError``."""
    if plan.num_blocks == 0:
        plan = plan.with_num_blocks(1)
    out = []
    for g in plan.groups:
        name = g.layer_names[0]
        page = layer_page(plan, name)
        out.append(
            {
                "group": group_label(plan, g),
                "layer": name,
                "page_bytes": page.page_bytes,
                "real_bytes": page.real_bytes,
                "kernel_pages": page.kernel_pages,
                "segments": [
                    [s.label, s.start, s.size, s.dtype] for s in page.segments
                ],
            }
        )
    return out


__all__ = [
    "MAX_CELLS",
    "PageMap",
    "Segment",
    "ViewRecipe",
    "as_bytes",
    "by_block",
    "describe_page",
    "group_label",
    "group_of",
    "is_legacy_attention",
    "kv_halves",
    "layer_page",
    "mamba_states",
    "page_facts",
    "page_regions",
    "registered_tensors",
]
