"""LMCache's KV-cache group edits, every release's, re-implemented as explorable rules.

LMCache's ``apply_kv_cache_group_edits``
(``lmcache/integration/vllm/kv_cache_group_edits.py``) re-views a Mamba layer
or a kernel-paged attention layer block-shaped; every rule here returns a view
of the registered bytes (never a copy), refuses with the numbers and says why
it declined.  Which rules a release has, in which order and in which variant,
is data in :mod:`kvexplore.editing.lmcache`; :func:`rules_for` builds
a release's registry.  With Qwen3.5-0.8B's shapes at 64 blocks (GDN page
1,114,112 B, block 544 = 17 kernel pages of 32):

* ``mamba-unified-view`` (unified, 0.5.3 on): ``[64, 1, 1, 1085440]`` int8 ->
  ``[64, 544, 1, 2000]``, strides ``(1114112, 2000, 2000, 1)`` for ``NHD``;
* ``mamba-page-view`` (legacy): ``[conv (64, 3, 6144) bf16, ssm (64, 16, 128,
  128) fp32]`` -> ``[64, 2, 544, 1, 512]`` bf16 over each whole page;
* ``mamba-slice-planes`` (0.5.7rc2): conv and SSM slices carved separately
  from a pool -> one ``[64, 544, 1, n / 544]`` uint8 plane each;
* ``subpaged-mla-attention-view`` (unified, 0.5.3 on): ``[B * 12, 64, 576]``
  under a 768-token block -> ``[B, 768, 576]``;
* ``subpaged-attention-view`` (legacy; unified from 0.5.6): ``[1088, 2, 32,
  2, 256]`` or unified ``[1088, 2, 32, 512]`` bf16 -> ``[64, 2, 544, 1, 512]``;
* ``subpaged-attention-interleaved-plane-view`` and
  ``subpaged-attention-contiguous-plane-view`` (0.5.7rc2): a (K, V) pair of
  ``[1088, 32, 2, 256]`` planes -> one ``[64, 2, 544, 1, 512]`` page view, or
  two ``[64, 544, 2, 256]`` views.

>>> import torch
>>> from vllm.v1.kv_cache_interface import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=8,
...                          dtype=torch.float16)
>>> legacy = torch.zeros(8, 2, 16, 2, 8, dtype=torch.float16)  # 2 blocks x 4 kernel pages
>>> rule = SubpagedAttentionViewEdit()
>>> rule.matches(spec, legacy)
True
>>> view = rule.apply(spec, legacy)
>>> tuple(view.shape), view.untyped_storage().data_ptr() == legacy.untyped_storage().data_ptr()
((2, 2, 64, 1, 16), True)
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec, KVCacheSpecKind

from kvexplore.editing.lmcache import (
    HINT_TRANSLATION,
    NEWEST_STABLE,
    lmcache_release,
)
from kvexplore.editing.registered import (
    REPORT_COLUMNS,
    EditResult,
    RegisteredKVCache,
    check_registration,
    describe,
    layout_facts,
    registration_problems,
    spec_kind,
    tensors_of,
)
from kvexplore.editing.validation import (
    as_kv_cache_config,
    declares_slot_compression,
    validate_kv_cache_groups,
)
from kvexplore.errors import KVExploreError
from kvexplore.layout import cdiv, element_extent, real_page_bytes
from kvexplore.layout import page_bytes as spec_page_bytes
from kvexplore.planning.planner import Plan
from kvexplore.planning.release import legacy_kv_cache_layout

__all__ = [
    "DEFAULT_EDITS",
    "RULE_CLASSES",
    "EditResult",
    "KVCacheGroupEdit",
    "MambaPageViewEdit",
    "MambaSlicePlanesEdit",
    "MambaUnifiedViewEdit",
    "SubpagedAttentionContiguousPlaneViewEdit",
    "SubpagedAttentionInterleavedPlaneViewEdit",
    "SubpagedAttentionViewEdit",
    "SubpagedMLAAttentionViewEdit",
    "apply_kv_cache_group_edits",
    "edit_each_layer",
    "layout_hint",
    "resolve_kv_layout",
    "rules_for",
]

# The page is opaque bytes, so one synthetic head holding a whole K- or V-half
# slab is enough; head_size' is derived to fill the page (as LMCache does).
_SYNTHETIC_NUM_HEADS = 1

# Standard-paged (non-MLA) attention kinds the sub-paged edit may re-view.
_SUBPAGEABLE_KINDS = frozenset(
    {
        KVCacheSpecKind.FULL_ATTENTION,
        KVCacheSpecKind.SLIDING_WINDOW,
        KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION,
        KVCacheSpecKind.SINK_FULL_ATTENTION,
    }
)

# Token widths the transfer kernels vectorize by, widest first
# (LMCache 0.5.6 ``_MambaUnifiedViewEdit.apply``).
_VECTOR_ALIGN_BYTES = (16, 8, 4, 2)


def _synthetic_head_size(page_bytes: int, elem_size: int, block_size: int) -> int:
    """The ``head_size'`` that makes ``[2, block_size, 1, head_size']`` one page
    (1,114,112 B of bf16 = 2 x 544 x 1 x 512); refused when it does not factor."""
    if page_bytes % elem_size:
        raise KVExploreError(
            f"page of {page_bytes} bytes is not a whole number of {elem_size}-byte "
            "elements; expected page_size_bytes to be a multiple of the element size"
        )
    elems = page_bytes // elem_size
    denominator = 2 * block_size * _SYNTHETIC_NUM_HEADS
    if block_size <= 0 or elems % denominator:
        raise KVExploreError(
            f"page ({elems} elements of {elem_size} bytes) does not factor into "
            f"(2, block_size={block_size}, num_heads={_SYNTHETIC_NUM_HEADS}, "
            f"head_size); expected a multiple of {denominator} elements"
        )
    return elems // denominator


def _checked_as_strided(
    t: torch.Tensor, size: Sequence[int], stride: Sequence[int], what: str
) -> torch.Tensor:
    """``t.as_strided`` from ``t``'s own offset, refused with the byte counts
    when it would leave the storage."""
    storage_offset = t.storage_offset()
    need = (storage_offset + element_extent(size, stride)) * t.element_size()
    have = t.untyped_storage().nbytes()
    if need > have:
        raise KVExploreError(
            f"{what} needs bytes up to {need} of the storage, which holds only "
            f"{have}; expected the registered buffer to cover every page"
        )
    return t.as_strided(tuple(size), tuple(stride), storage_offset)


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """Permute ``t``'s dims outermost-first by stride (a view); a size-1 dim
    that ties goes innermost, as LMCache's ``attempt_permute_to_contiguous_view``."""
    strides = t.stride()
    order = sorted(
        range(t.ndim), key=lambda i: (strides[i], t.shape[i] != 1), reverse=True
    )
    return t.permute(order)


def _regroup_kernel_pages(
    kv_cache: torch.Tensor,
    spec: KVCacheSpec,
    *,
    rows_dim: int,
    logical_rows: int,
    memory_order: bool,
    noun: str,
) -> tuple[torch.Tensor, int]:
    """The tiling check of the sub-paged rules: ``(tensor to view from, blocks)``.

    Refused unless ``logical_rows`` is a whole number of kernel pages of
    ``kv_cache.shape[rows_dim]`` rows, the kernel-page count divides by that
    ratio, the kernel pages tile the logical page exactly, and they are
    contiguous (in memory order for a unified permute view).
    """
    kernel_rows = kv_cache.shape[rows_dim]
    if kernel_rows <= 0 or logical_rows % kernel_rows:
        raise KVExploreError(
            f"logical block of {logical_rows} rows is not a multiple of the "
            f"{noun} kernel block of {kernel_rows} rows; expected whole kernel pages"
        )
    ratio = logical_rows // kernel_rows
    num_kernel_pages = kv_cache.shape[0]
    if num_kernel_pages % ratio:
        raise KVExploreError(
            f"kernel page count {num_kernel_pages} is not a multiple of the "
            f"logical/kernel block ratio {ratio}; expected whole logical blocks"
        )
    kernel_page_bytes = math.prod(kv_cache.shape[1:]) * kv_cache.element_size()
    page_bytes = spec_page_bytes(spec)
    if kernel_page_bytes * ratio != page_bytes:
        raise KVExploreError(
            f"{ratio} kernel pages of {kernel_page_bytes} bytes "
            f"({kernel_page_bytes * ratio} bytes) do not tile the logical page "
            f"({page_bytes} bytes); expected an exact tiling"
        )
    ordered = _memory_order(kv_cache) if memory_order else kv_cache
    if not ordered.is_contiguous():
        order = "in memory order" if memory_order else "in logical order"
        raise KVExploreError(
            f"kernel-paged {noun} tensor (shape {tuple(kv_cache.shape)}, strides "
            f"{tuple(kv_cache.stride())}) is not contiguous {order}; expected "
            "the kernel pages of a block to sit back to back"
        )
    if memory_order and ordered.shape[0] != num_kernel_pages:
        raise KVExploreError(
            f"outermost memory dim has {ordered.shape[0]} entries, not the "
            f"{num_kernel_pages} kernel pages; expected a blocks-first layout"
        )
    return ordered, num_kernel_pages // ratio


#: LMCache's layout hints whose token dim N sits outside the head dim H.
_TOKENS_OUTSIDE_HEADS = frozenset({"NHD", "BLNHC"})
#: The hints LMCache 0.5.6's rules accept (``KV_LAYOUT_NAMES``).
KV_LAYOUT_HINTS = ("NHD", "HND", "BLHNC", "BLNHC")


def resolve_kv_layout(
    kv_layout: str | None, accepted: Sequence[str] = KV_LAYOUT_HINTS
) -> bool:
    """True when the hint puts tokens outside heads (``NHD``, ``BLNHC``).

    ``kv_layout`` is an LMCache hint or a vLLM ``KVCacheLayout`` (name), read
    as LMCache translates it (``LBNHC`` -> ``NHD``, ``LBHNC`` -> ``HND``);
    refused unless the result is one of ``accepted`` (the release's)."""
    name = getattr(kv_layout, "name", kv_layout)
    if isinstance(name, str):
        key = HINT_TRANSLATION.get(name.upper(), name.upper())
        if key in accepted:
            return key in _TOKENS_OUTSIDE_HEADS
    hint = (
        " (pass kv_layout=, or a KVCacheConfig whose kv_cache_layout is set)"
        if kv_layout is None
        else ""
    )
    raise KVExploreError(
        f"kv_layout={kv_layout!r} is not a layout hint this rule accepts{hint}; "
        f"expected one of {', '.join(accepted)} (or vLLM's LBNHC / LBHNC)"
    )


class KVCacheGroupEdit(ABC):
    """One structural re-view of a layer's registered KV cache (LMCache's
    ``KVCacheGroupEdit``): ``matches`` decides from the spec and the value
    alone and never raises; ``apply`` returns a view of the same storage or
    raises ``ValueError`` with the numbers; ``why_not`` says why it declined.
    Subclass it and pass ``rules=[...]`` to :func:`apply_kv_cache_group_edits`.
    """

    #: Label of the rule in reports (LMCache's names for the built-ins).
    name: str = "unnamed-edit"
    #: Which registration the rule was written for: "legacy", "unified", "both".
    era: str = "both"

    @abstractmethod
    def matches(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> bool:
        """Whether this rule re-views the layer (pure, never raises)."""

    @abstractmethod
    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        """The edited view; raises ``ValueError`` on a layout it cannot tile."""

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        """``None`` if the rule matches, otherwise the reason it declines."""
        return None if self.matches(spec, kv_cache) else "matches() returned False"

    def explain_match(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str:
        """One line: ``"<name>: matches"`` or ``"<name>: <reason>"``."""
        reason = self.why_not(spec, kv_cache)
        return f"{self.name}: {'matches' if reason is None else reason}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.era})>"


class _ReasonedEdit(KVCacheGroupEdit):
    """Built-in rules decide once, in ``why_not``; ``matches`` follows it."""

    def matches(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> bool:
        return self.why_not(spec, kv_cache) is None

    @abstractmethod
    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        """Reason this rule declines, or ``None`` when it matches."""


class MambaPageViewEdit(_ReasonedEdit):
    """Legacy Mamba state list -> one attention-shaped page (``mamba-page-view``).

    LMCache's ``_MambaPageViewEdit``: the whole padded page (``conv | ssm |
    pad``) re-viewed from the conv state as ``[B, 2, block_size, 1, h']`` in
    its dtype.  What it matches is the release's (``values``): ``"any"``
    Mamba value (0.4.7-0.5.2, which then refuse a unified tensor), a
    ``"list"`` of states (0.5.3-0.5.6), or a list whose conv state steps one
    ``"page-strided"`` page per block (0.5.7rc2).  Refused unless there is
    one tensor per ``MambaSpec.shapes`` entry, the conv state starts at its
    storage's first byte (``conv_at_storage_start``; 0.5.7rc2 keeps any
    offset instead), each state steps one page per block, the states sit
    back to back and the page factors.
    """

    name = "mamba-page-view"
    era = "legacy"

    def __init__(self, *, values: str = "list", conv_at_storage_start: bool = True):
        if values not in ("any", "list", "page-strided"):
            raise KVExploreError(
                f"values={values!r}; expected 'any', 'list' or 'page-strided'"
            )
        self.values = values
        self.conv_at_storage_start = bool(conv_at_storage_start)

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MAMBA:
            return f"spec kind is {kind.value}, not mamba"
        if self.values == "any":
            return None
        if isinstance(kv_cache, torch.Tensor):
            return (
                f"registered value is one {kv_cache.ndim}-D tensor (unified "
                "registration), not a legacy list of state tensors"
            )
        if not isinstance(kv_cache, list):
            return f"registered value is a {type(kv_cache).__name__}, not a list"
        if self.values == "page-strided":
            conv = kv_cache[0] if kv_cache else None
            if not isinstance(conv, torch.Tensor) or conv.ndim == 0:
                return "the list holds no conv state tensor first"
            step, page = conv.stride(0) * conv.element_size(), spec_page_bytes(spec)
            if step != page:
                return (
                    f"conv state steps {step} B per block, not the {page}-byte page "
                    "(a slice-strided state)"
                )
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        expected = len(getattr(spec, "shapes", ())) or 2
        if (
            not isinstance(kv_cache, list)
            or len(kv_cache) != expected
            or not all(isinstance(t, torch.Tensor) for t in kv_cache)
        ):
            raise KVExploreError(
                f"Mamba layer registered as {describe(kv_cache)}; expected a list "
                f"of {expected} tensors ([conv_state, ssm_state] per "
                "MambaSpec.shapes) in the legacy registration"
            )
        page_bytes = spec_page_bytes(spec)
        conv = kv_cache[0]
        elem = conv.element_size()
        base_bytes = conv.storage_offset() * elem
        if base_bytes and self.conv_at_storage_start:
            raise KVExploreError(
                f"Mamba conv state must start at its storage's first byte: its byte "
                f"offset {base_bytes} (storage_offset={conv.storage_offset()}) is not 0 "
                f"({base_bytes / page_bytes:g} of the {page_bytes}-byte pages); expected "
                "the first page of its buffer"
            )
        num_blocks = conv.shape[0] if conv.ndim else 0
        cursor = base_bytes
        for index, state in enumerate(kv_cache):
            state_elem = state.element_size()
            if state.ndim == 0 or state.shape[0] != num_blocks:
                raise KVExploreError(
                    f"Mamba state {index} has shape {tuple(state.shape)}; expected "
                    f"{num_blocks} blocks in dim 0 like the conv state"
                )
            if state.device != conv.device or (
                state.untyped_storage().data_ptr() != conv.untyped_storage().data_ptr()
            ):
                raise KVExploreError(
                    f"Mamba state {index} lives in a different buffer than the conv "
                    "state; expected all states to view one padded page per block"
                )
            step = state.stride(0) * state_elem
            if step != page_bytes:
                raise KVExploreError(
                    f"Mamba state {index} per-block stride ({step} bytes) does not "
                    f"equal the page size ({page_bytes} bytes)"
                )
            start = state.storage_offset() * state_elem
            if start != cursor:
                raise KVExploreError(
                    f"Mamba state {index} starts at byte {start - base_bytes} of "
                    f"its page; expected {cursor - base_bytes} (conv | ssm | pad, "
                    "back to back)"
                )
            if not state[0].is_contiguous():
                raise KVExploreError(
                    f"Mamba state {index} is not contiguous within a page "
                    f"(strides {tuple(state.stride())}); expected dense state rows"
                )
            cursor += math.prod(state.shape[1:]) * state_elem
        if cursor - base_bytes > page_bytes:
            raise KVExploreError(
                f"Mamba states take {cursor - base_bytes} bytes, more than the "
                f"{page_bytes}-byte page"
            )
        return _page_view(conv, num_blocks, spec.block_size, page_bytes, "mamba-page-view")

    def __repr__(self) -> str:
        start = "conv at storage start" if self.conv_at_storage_start else "any offset"
        return f"<{type(self).__name__} {self.name!r} ({self.values}, {start})>"


class SubpagedAttentionViewEdit(_ReasonedEdit):
    """Kernel-paged attention -> logical-block pages (``subpaged-attention-view``).

    LMCache's ``_SubpagedAttentionViewEdit``: the kernel pages of a block
    (``select_common_block_size``) become one ``[2, block_size, 1, h']`` page;
    a legacy rank-5 tensor must be contiguous in logical order, a unified
    rank-4 one in memory order.  ``ranks``: the tensor ranks the release
    re-views (5 up to 0.5.5; 4 and 5 from 0.5.6); ``slot_compression``: the
    spec fields that exclude a layer (see
    :func:`~kvexplore.editing.validation.declares_slot_compression`).
    ``kv_layout`` is not read.
    """

    name = "subpaged-attention-view"
    era = "both"

    def __init__(
        self,
        *,
        ranks: tuple[int, ...] = (4, 5),
        slot_compression: object = None,
    ):
        self.ranks = tuple(sorted(ranks))
        self.slot_compression = slot_compression or NEWEST_STABLE

    def __repr__(self) -> str:
        ranks = " or ".join(f"{r}-D" for r in self.ranks)
        return f"<{type(self).__name__} {self.name!r} ({ranks})>"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind not in _SUBPAGEABLE_KINDS:
            return f"spec kind is {kind.value}, not a standard-paged attention kind"
        if declares_slot_compression(spec, self.slot_compression):
            return "spec declares slot compression (compression path, not edited)"
        if not isinstance(kv_cache, torch.Tensor):
            return f"registered value is a {type(kv_cache).__name__}, not a tensor"
        if kv_cache.ndim not in self.ranks:
            ranks = " or ".join(f"{r}-D" for r in self.ranks)
            return f"tensor is {kv_cache.ndim}-D; this rule re-views {ranks} tensors"
        if kv_cache.shape[2] == spec.block_size:
            return (
                f"already paged at the logical block size ({spec.block_size} "
                "tokens in dim 2)"
            )
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim not in self.ranks:
            shapes = {
                5: "(kernel_pages, 2, kernel_block, heads, head_size)",
                4: "(kernel_pages, heads, kernel_block, K|V bytes)",
            }
            raise KVExploreError(
                f"attention layer registered as {describe(kv_cache)}; expected "
                + " or ".join(shapes[r] for r in reversed(self.ranks))
            )
        if kv_cache.ndim == 5 and kv_cache.shape[1] != 2:
            raise KVExploreError(
                f"legacy attention tensor has shape {tuple(kv_cache.shape)}; "
                "expected 2 (K, V) in dim 1"
            )
        # Rank 5 keeps LMCache's logical-order guard: a permuted legacy HND
        # tensor would otherwise be re-viewed and misread downstream.
        ordered, num_blocks = _regroup_kernel_pages(
            kv_cache,
            spec,
            rows_dim=2,
            logical_rows=spec.block_size,
            memory_order=kv_cache.ndim == 4,
            noun="attention",
        )
        head = _synthetic_head_size(
            spec_page_bytes(spec), kv_cache.element_size(), spec.block_size
        )
        return ordered.view(num_blocks, 2, spec.block_size, _SYNTHETIC_NUM_HEADS, head)


class MambaUnifiedViewEdit(_ReasonedEdit):
    """Unified Mamba state row -> ``block_size`` token rows (``mamba-unified-view``).

    LMCache's ``_MambaUnifiedViewEdit``: the ``[B, 1, 1, row]`` int8 row is
    spread over ``block_size`` tokens of ``ceil(row / block_size)`` bytes,
    rounded up to the widest vector width (16, 8, 4, 2 B) dividing the page
    step that still fits the page: ``[B, block_size, 1, h]`` for an NHD-style
    hint, ``[B, 1, block_size, h]`` for HND.  Refused without a hint the
    release accepts (``hints``: ``NHD`` / ``HND``, from 0.5.6 also ``BLNHC``
    / ``BLHNC``; vLLM's ``LBNHC`` / ``LBHNC`` read as ``NHD`` / ``HND``), for
    a row that is not dense ``[blocks, 1, 1, row]``, or when no width fits.
    ``tiling="reshape"`` is 0.5.3 and 0.5.4's: a plain ``view(B, block_size,
    1, -1)`` (or ``(B, 1, block_size, -1)``), which raises torch's
    ``RuntimeError`` (kvexplore: a refusal saying LMCache crashes) unless the
    row divides into ``block_size`` tokens.
    """

    name = "mamba-unified-view"
    era = "unified"

    def __init__(
        self,
        *,
        tiling: str = "aligned",
        hints: tuple[str, ...] = ("NHD", "HND", "BLHNC", "BLNHC"),
    ):
        if tiling not in ("aligned", "reshape"):
            raise KVExploreError(f"tiling={tiling!r}; expected 'aligned' or 'reshape'")
        self.tiling = tiling
        self.hints = tuple(hints)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.tiling}, {'/'.join(self.hints)})>"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MAMBA:
            return f"spec kind is {kind.value}, not mamba"
        if not isinstance(kv_cache, torch.Tensor):
            return (
                f"registered value is a {type(kv_cache).__name__} (legacy "
                "registration), not a unified 4-D tensor"
            )
        if kv_cache.ndim != 4:
            return f"tensor is {kv_cache.ndim}-D; expected unified [B, 1, 1, row]"
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim != 4:
            raise KVExploreError(
                f"Mamba layer registered as {describe(kv_cache)}; expected a "
                "unified 4-D [blocks, 1, 1, row] tensor"
            )
        tokens_outside = resolve_kv_layout(kv_layout, self.hints)
        num_blocks, heads, states, row = kv_cache.shape
        if self.tiling == "reshape":
            return _reshaped_row(kv_cache, spec.block_size, tokens_outside)
        if (heads, states) != (1, 1) or kv_cache.stride(3) != 1:
            raise KVExploreError(
                f"unified Mamba tensor has shape {tuple(kv_cache.shape)}, strides "
                f"{tuple(kv_cache.stride())}; expected [blocks, 1, 1, row] with a "
                "dense row (stride 1)"
            )
        block_size = spec.block_size
        elem = kv_cache.element_size()
        step_bytes = kv_cache.stride(0) * elem
        page_bytes = spec_page_bytes(spec)
        base = cdiv(row, block_size) if block_size > 0 else 0
        head = 0
        for align in _VECTOR_ALIGN_BYTES:
            if align % elem or step_bytes % align:
                continue
            unit = align // elem
            candidate = cdiv(base, unit) * unit
            if candidate * block_size * elem <= page_bytes:
                head = candidate
                break
        if head == 0:
            raise KVExploreError(
                f"cannot tile a {row}-element state row into {block_size} aligned "
                f"tokens within the {page_bytes}-byte page (page step {step_bytes} "
                f"bytes); expected ceil(row / block_size) rounded to 2-16 bytes to fit"
            )
        if tokens_outside:
            shape = (num_blocks, block_size, 1, head)
            strides = (kv_cache.stride(0), head, head, 1)
        else:
            shape = (num_blocks, 1, block_size, head)
            strides = (kv_cache.stride(0), block_size * head, head, 1)
        return _checked_as_strided(kv_cache, shape, strides, "mamba-unified-view")


def _mla_rows_dim(kv_cache: torch.Tensor) -> int:
    """Dim of the stored states: ``[B, states, C]``, ``[B, 1, states, C]`` (HND)
    or ``[B, states, 1, C]`` (NHD)."""
    if kv_cache.ndim == 4 and kv_cache.shape[2] == 1 and kv_cache.shape[1] != 1:
        return 1
    return kv_cache.ndim - 2


class SubpagedMLAAttentionViewEdit(_ReasonedEdit):
    """Kernel-paged MLA cache -> logical pages (``subpaged-mla-attention-view``).

    LMCache's ``_SubpagedMLAAttentionViewEdit``: ``spec.num_states`` rows per
    page (slot compression stays intact), tiled as the attention rule does,
    on a rank-3 or rank-4 cache (0.5.6 on).  ``rows="block"`` is 0.5.3-0.5.5's:
    rank 3 only, ``block_size`` rows per page, slot-compressed specs
    (``slot_compression``) left alone, re-viewed as ``[B, block_size, -1]``.
    """

    name = "subpaged-mla-attention-view"
    era = "unified"

    def __init__(self, *, rows: str = "states", slot_compression: object = None):
        if rows not in ("states", "block"):
            raise KVExploreError(f"rows={rows!r}; expected 'states' or 'block'")
        self.rows = rows
        self.slot_compression = slot_compression or NEWEST_STABLE

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.rows} rows)>"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MLA_ATTENTION:
            return f"spec kind is {kind.value}, not mla_attention"
        if self.rows == "block" and declares_slot_compression(
            spec, self.slot_compression
        ):
            return "spec declares slot compression (compression path, not edited)"
        if not isinstance(kv_cache, torch.Tensor):
            return f"registered value is a {type(kv_cache).__name__}, not a tensor"
        if self.rows == "block":
            if kv_cache.ndim != 3:
                return f"tensor is {kv_cache.ndim}-D; this rule re-views 3-D MLA pages"
            if kv_cache.shape[1] == spec.block_size:
                return f"already paged at the logical block of {spec.block_size} rows"
            return None
        if kv_cache.ndim not in (3, 4):
            return f"tensor is {kv_cache.ndim}-D; expected 3-D or 4-D MLA pages"
        rows = kv_cache.shape[_mla_rows_dim(kv_cache)]
        if rows == spec.num_states:
            return f"already paged at the logical {rows} states per block"
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        if self.rows == "block":
            if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim != 3:
                raise KVExploreError(
                    f"MLA layer registered as {describe(kv_cache)}; expected "
                    "[pages, rows, C]"
                )
            ordered, num_blocks = _regroup_kernel_pages(
                kv_cache,
                spec,
                rows_dim=1,
                logical_rows=spec.block_size,
                memory_order=False,
                noun="MLA",
            )
            return ordered.view(num_blocks, spec.block_size, -1)
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim not in (3, 4):
            raise KVExploreError(
                f"MLA layer registered as {describe(kv_cache)}; expected "
                "[pages, states, C] or [pages, 1, states, C] / [pages, states, 1, C]"
            )
        rows_dim = _mla_rows_dim(kv_cache)
        if kv_cache.ndim == 4 and kv_cache.shape[3 - rows_dim] != 1:
            raise KVExploreError(
                f"MLA tensor {tuple(kv_cache.shape)} has "
                f"{kv_cache.shape[3 - rows_dim]} head slots; expected 1"
            )
        num_states = spec.num_states
        ordered, num_blocks = _regroup_kernel_pages(
            kv_cache,
            spec,
            rows_dim=rows_dim,
            logical_rows=num_states,
            memory_order=False,
            noun="MLA",
        )
        shape = list(ordered.shape)
        shape[0] = num_blocks
        shape[rows_dim] = num_states
        return ordered.view(shape)


class MambaSlicePlanesEdit(_ReasonedEdit):
    """Slice-strided Mamba states -> one uint8 plane each (``mamba-slice-planes``).

    LMCache 0.5.7rc2's ``_MambaSlicePlaneEdit``, for registrations that carve
    ``conv`` and ``ssm`` as separate dense slices of a pool (each steps its
    own bytes per block, not the padded page: vLLM-Ascend up to 0.29): each
    state ``[B, ...]`` of ``n`` bytes per block becomes ``[B, block_size, 1,
    n / block_size]`` uint8 at its own offset.  Matches a list of dense
    states with one block count whose per-block bytes ``block_size``
    divides, and whose conv state does not step one page per block.
    """

    name = "mamba-slice-planes"
    era = "legacy"

    @staticmethod
    def _block_bytes(state: torch.Tensor) -> int | None:
        if state.ndim == 0 or state.shape[0] <= 0 or not state.is_contiguous():
            return None
        return state.numel() * state.element_size() // state.shape[0]

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MAMBA:
            return f"spec kind is {kind.value}, not mamba"
        if not isinstance(kv_cache, list) or not kv_cache:
            return f"registered value is {describe(kv_cache)}, not a list of states"
        if not all(isinstance(t, torch.Tensor) for t in kv_cache):
            return "the list holds something other than tensors"
        block_size = spec.block_size
        if block_size <= 0:
            return f"block_size is {block_size}"
        for index, state in enumerate(kv_cache):
            nbytes = self._block_bytes(state)
            if nbytes is None:
                return f"state {index} is not a dense slice (strides {tuple(state.stride())})"
            if nbytes % block_size:
                return (
                    f"state {index} holds {nbytes} B per block, not a multiple of "
                    f"block_size {block_size}"
                )
        if len({t.shape[0] for t in kv_cache}) != 1:
            return "the states cover different block counts"
        conv = kv_cache[0]
        if conv.stride(0) * conv.element_size() == spec_page_bytes(spec):
            return "conv state steps one page per block (mamba-page-view's layout)"
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> list[torch.Tensor]:
        if not isinstance(kv_cache, list) or not kv_cache:
            raise KVExploreError(
                f"Mamba layer registered as {describe(kv_cache)}; expected a list of "
                "state slices"
            )
        counts = sorted({t.shape[0] for t in kv_cache})
        if len(counts) != 1:
            raise KVExploreError(f"Mamba states cover different block counts {counts}")
        planes = []
        for index, state in enumerate(kv_cache):
            nbytes = self._block_bytes(state)
            if nbytes is None or nbytes % spec.block_size:
                raise KVExploreError(
                    f"Mamba state {index} (shape {tuple(state.shape)}, strides "
                    f"{tuple(state.stride())}) is not a dense slice whose bytes per "
                    f"block divide into block_size {spec.block_size}"
                )
            width = nbytes // spec.block_size
            raw = state.view(torch.uint8)
            planes.append(
                _checked_as_strided(
                    raw,
                    (state.shape[0], spec.block_size, 1, width),
                    (nbytes, width, width, 1),
                    "mamba-slice-planes",
                )
            )
        return planes


def _kv_planes(kv_cache: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(K, V)`` when ``kv_cache`` is a list or tuple of two tensors."""
    if isinstance(kv_cache, (list, tuple)) and len(kv_cache) == 2:
        if all(isinstance(t, torch.Tensor) for t in kv_cache):
            return kv_cache[0], kv_cache[1]
    return None


def _plane_ratio(
    spec: KVCacheSpec, k: torch.Tensor, v: torch.Tensor, slot_compression
) -> int | str:
    """Kernel pages per logical block of a ``[pages, kernel_block, heads,
    head_size]`` (K, V) pair, or why the pair is not sub-paged attention."""
    kind = spec_kind(spec)
    if kind not in _SUBPAGEABLE_KINDS:
        return f"spec kind is {kind.value}, not a standard-paged attention kind"
    if declares_slot_compression(spec, slot_compression):
        return "spec declares slot compression (compression path, not edited)"
    if k.ndim != 4 or v.ndim != 4 or k.shape != v.shape:
        return f"K {tuple(k.shape)} and V {tuple(v.shape)} are not two equal 4-D planes"
    if k.dtype != v.dtype or k.device != v.device:
        return "K and V differ in dtype or device"
    kernel, logical = k.shape[1], spec.block_size
    if kernel <= 0 or kernel >= logical or logical % kernel:
        return f"kernel block {kernel} does not divide the logical block {logical} below it"
    ratio = logical // kernel
    if k.shape[0] % ratio:
        return f"{k.shape[0]} kernel pages are not whole blocks of {ratio}"
    return ratio


def _dense_row(plane: torch.Tensor) -> bool:
    """Whether ``[kernel_block, heads, head_size]`` of ``plane`` is dense (dim 0 may gap)."""
    _, _, heads, size = plane.shape
    return (
        plane.stride(3) == 1
        and plane.stride(2) == size
        and plane.stride(1) == heads * size
    )


class _KVPlanesEdit(_ReasonedEdit):
    """What the two (K, V)-plane rules share: a pair of ``[pages,
    kernel_block, heads, head_size]`` planes whose kernel block divides the
    logical block, and the tiling check of ``apply`` (the span of ``ratio``
    kernel pages, :meth:`span`, against the page, :meth:`page`)."""

    def __init__(self, *, slot_compression: object = None):
        self.slot_compression = slot_compression or NEWEST_STABLE

    def _pair(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache):
        """``(K, V, ratio)``, or why the value is no sub-paged (K, V) pair."""
        planes = _kv_planes(kv_cache)
        if planes is None:
            return f"registered value is {describe(kv_cache)}, not a (K, V) pair"
        ratio = _plane_ratio(spec, *planes, self.slot_compression)
        return ratio if isinstance(ratio, str) else (*planes, ratio)

    @staticmethod
    @abstractmethod
    def span(k: torch.Tensor, ratio: int) -> int:
        """Bytes of one logical block's K and V kernel pages."""

    @staticmethod
    def page(spec: KVCacheSpec) -> int:
        """The page bytes those kernel pages must tile."""
        return spec_page_bytes(spec)

    def _tiled(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache):
        """``(K, V, ratio)`` for ``apply``, refused unless the kernel pages
        tile the page and the page count is whole blocks."""
        planes = _kv_planes(kv_cache)
        if planes is None:
            raise KVExploreError(
                f"attention layer registered as {describe(kv_cache)}; expected a (K, V) pair"
            )
        k, v = planes
        logical, kernel = spec.block_size, k.shape[1]
        if kernel <= 0 or logical % kernel:
            raise KVExploreError(
                f"logical block of {logical} rows is not a multiple of the kernel "
                f"block of {kernel} rows; expected whole kernel pages"
            )
        ratio = logical // kernel
        span, page = self.span(k, ratio), self.page(spec)
        if span != page:
            raise KVExploreError(
                f"{ratio} kernel pages of K and V ({span} bytes) do not tile the "
                f"logical page ({page} bytes); expected an exact tiling"
            )
        if k.shape[0] % ratio:
            raise KVExploreError(
                f"kernel page count {k.shape[0]} is not a multiple of the "
                f"logical/kernel block ratio {ratio}; expected whole logical blocks"
            )
        return k, v, ratio


class SubpagedAttentionInterleavedPlaneViewEdit(_KVPlanesEdit):
    """Interleaved (K, V) kernel pages -> one logical page per block
    (``subpaged-attention-interleaved-plane-view``).

    LMCache 0.5.7rc2's rule for split attention caches whose K and V kernel
    pages alternate in one pool (``K0 V0 K1 V1 ...``, vLLM-Ascend 0.30): K
    steps two rows per kernel page and V starts one row after K.  The
    ``ratio`` kernel pages of a block are one byte span of ``page_size_bytes``,
    re-viewed from K as ``[B, 2, block_size, 1, h']`` (the halves are not K
    and V).
    """

    name = "subpaged-attention-interleaved-plane-view"
    era = "legacy"

    @staticmethod
    def span(k: torch.Tensor, ratio: int) -> int:
        return ratio * k.stride(0) * k.element_size()

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        pair = self._pair(spec, kv_cache)
        if isinstance(pair, str):
            return pair
        k, v, ratio = pair
        if not (_dense_row(k) and _dense_row(v)):
            return "K or V rows are not dense [kernel_block, heads, head_size]"
        row_elems = math.prod(k.shape[1:])
        row_bytes = row_elems * k.element_size()
        step = k.stride(0) * k.element_size()
        if step != 2 * row_bytes or v.stride(0) != k.stride(0):
            return f"K steps {step} B per kernel page, not one K row and one V row"
        if k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr():
            return "K and V are different allocations"
        if v.storage_offset() != k.storage_offset() + row_elems:
            return "V does not start one row after K"
        if v.data_ptr() - k.data_ptr() != row_bytes:
            return "V does not start one row after K"
        if self.span(k, ratio) != self.page(spec):
            return (
                f"{ratio} kernel pages of {step} B do not span the "
                f"{self.page(spec)}-byte page"
            )
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        k, _, ratio = self._tiled(spec, kv_cache)
        return _page_view(k, k.shape[0] // ratio, spec.block_size, self.page(spec))


class SubpagedAttentionContiguousPlaneViewEdit(_KVPlanesEdit):
    """Two dense kernel-paged planes -> each at the logical block
    (``subpaged-attention-contiguous-plane-view``).

    LMCache 0.5.7rc2's rule for split attention caches whose K pages and V
    pages each sit back to back (vLLM-Ascend up to 0.29): ``[pages,
    kernel_block, heads, head_size]`` K and V become ``[pages / ratio,
    block_size, heads, head_size]`` each, a list of two views.  The tiling
    is checked against the spec's unpadded page (``real_page_size_bytes``).
    """

    name = "subpaged-attention-contiguous-plane-view"
    era = "legacy"

    @staticmethod
    def span(k: torch.Tensor, ratio: int) -> int:
        return 2 * ratio * math.prod(k.shape[1:]) * k.element_size()

    @staticmethod
    def page(spec: KVCacheSpec) -> int:
        return real_page_bytes(spec)

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        pair = self._pair(spec, kv_cache)
        if isinstance(pair, str):
            return pair
        k, v, ratio = pair
        if not (k.is_contiguous() and v.is_contiguous()):
            return "K or V is not contiguous"
        if self.span(k, ratio) != self.page(spec):
            return (
                f"{ratio} kernel pages of K and V ({self.span(k, ratio)} B) do not "
                f"tile the {self.page(spec)}-byte unpadded page"
            )
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> list[torch.Tensor]:
        k, v, ratio = self._tiled(spec, kv_cache)
        shape = (k.shape[0] // ratio, spec.block_size, k.shape[2], k.shape[3])
        return [k.view(shape), v.view(shape)]


def _page_view(
    base: torch.Tensor,
    num_blocks: int,
    block_size: int,
    page_bytes: int,
    what: str = "page view",
):
    """``[num_blocks, 2, block_size, 1, h']`` over whole pages from ``base``'s
    offset (``what`` names the view in a refusal)."""
    head = _synthetic_head_size(page_bytes, base.element_size(), block_size)
    page_elems = page_bytes // base.element_size()
    shape = (num_blocks, 2, block_size, _SYNTHETIC_NUM_HEADS, head)
    strides = (page_elems, block_size * head, head, head, 1)
    return _checked_as_strided(base, shape, strides, what)


def _reshaped_row(kv_cache: torch.Tensor, block_size: int, tokens_outside: bool):
    """LMCache 0.5.3/0.5.4's ``view(B, block_size, 1, -1)`` (``(B, 1,
    block_size, -1)`` for HND) of a unified Mamba row; torch's refusal of a
    row that does not divide is LMCache's crash, reported as such."""
    shape = (
        (kv_cache.shape[0], block_size, 1, -1)
        if tokens_outside
        else (kv_cache.shape[0], 1, block_size, -1)
    )
    try:
        return kv_cache.view(shape)
    except RuntimeError as exc:
        raise KVExploreError(
            f"LMCache crashes here: its view{shape} of the {tuple(kv_cache.shape)} "
            f"row raises RuntimeError: {exc}"
        ) from None


#: Rule name -> class; a release's options pick the variant (see
#: :mod:`kvexplore.editing.lmcache`).
RULE_CLASSES: dict[str, type[KVCacheGroupEdit]] = {
    cls.name: cls
    for cls in (
        MambaUnifiedViewEdit,
        MambaPageViewEdit,
        MambaSlicePlanesEdit,
        SubpagedMLAAttentionViewEdit,
        SubpagedAttentionViewEdit,
        SubpagedAttentionInterleavedPlaneViewEdit,
        SubpagedAttentionContiguousPlaneViewEdit,
    )
}
def rules_for(lmcache: object = None) -> tuple[KVCacheGroupEdit, ...]:
    """The rule registry of an LMCache release, in its priority order (first
    match wins): ``rules_for("0.5.2")`` has ``mamba-page-view`` and
    ``subpaged-attention-view``; ``lmcache`` as for
    :func:`~kvexplore.editing.lmcache.lmcache_release`."""
    release = lmcache_release(lmcache)
    rules = []
    for name in release.rules:
        cls = RULE_CLASSES[name]
        options = dict(release.options.get(name, {}))
        if "slot_compression" in inspect.signature(cls).parameters:
            options["slot_compression"] = release  # the release's compression fields
        rules.append(cls(**options))
    return tuple(rules)


#: The rules of LMCache :data:`~kvexplore.editing.lmcache.NEWEST_STABLE`
#: (0.5.6), in its priority order.
DEFAULT_EDITS: tuple[KVCacheGroupEdit, ...] = rules_for(NEWEST_STABLE)


def layout_hint(
    lmcache: object, kv_layout: object, config_layout: object
) -> str | None:
    """The ``kv_layout`` hint an LMCache release passes its rules.

    ``kv_layout`` given: that hint (a vLLM ``KVCacheLayout`` name translated
    as 0.5.5 and later translate it).  Otherwise from the config's resolved
    layout, as the release's ``vllm_layout_hints`` builds it: none before
    0.5.3; vLLM's own ``get_kv_cache_layout()`` for 0.5.3 and 0.5.4 (no hint
    where the installed vLLM has none); the translated layout from 0.5.5,
    which refuses a layout LMCache cannot transfer."""
    release = lmcache_release(lmcache)
    if kv_layout is not None:
        name = getattr(kv_layout, "name", kv_layout)
        if release.layout_hint == "translated" and isinstance(name, str):
            return HINT_TRANSLATION.get(name.upper(), name)
        return name
    if release.layout_hint == "none":
        return None
    if release.layout_hint == "vllm-getter":
        return legacy_kv_cache_layout()
    name = getattr(config_layout, "name", config_layout)
    if name is None:
        return None
    if name not in HINT_TRANSLATION:
        raise KVExploreError(
            f"{release} cannot transfer the {name!r} KV cache layout (its "
            "translate_vllm_kv_cache_layout refuses it: per-block content is "
            f"fragmented per head); expected one of {', '.join(HINT_TRANSLATION)}"
        )
    return HINT_TRANSLATION[name]


def _check_rules(rules: object, release) -> tuple[KVCacheGroupEdit, ...]:
    if rules is None:
        return rules_for(release)
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Iterable):
        raise KVExploreError(
            f"rules is a {type(rules).__name__}; expected a sequence of "
            "KVCacheGroupEdit objects"
        )
    checked = tuple(rules)
    for rule in checked:
        if not all(hasattr(rule, a) for a in ("name", "matches", "apply")):
            raise KVExploreError(
                f"rule {rule!r} lacks name/matches/apply; expected a KVCacheGroupEdit"
            )
    return checked


def _is_view_of(view: object, sources: list[torch.Tensor]) -> bool:
    """A tensor, or a list of tensors, every one over a storage of ``sources``."""
    views = tensors_of(view) if isinstance(view, list) else [view]
    if not views or not all(isinstance(v, torch.Tensor) for v in views):
        return False
    return all(
        any(
            t.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
            and t.device == v.device
            for t in sources
        )
        for v in views
    )


class _LayerRefusal(KVExploreError):
    """A rule's refusal of one layer: the message names the layer, its group
    and the rule; ``rule`` is the rule's name and ``reason`` its own words."""

    def __init__(self, message: str, rule: str, reason: str):
        super().__init__(message)
        self.rule = rule
        self.reason = reason


def _seen_spec(release, config: KVCacheConfig, group: int | None, spec: KVCacheSpec):
    """The spec a release's rules see for a layer: its own where the release
    hands each layer its spec (``per_layer_specs``), else its group's."""
    if release.per_layer_specs or group is None:
        return spec
    return config.kv_cache_groups[group].kv_cache_spec


def _edit_layer(
    name: str,
    group: int | None,
    spec: KVCacheSpec,
    value: RegisteredKVCache,
    rules: Sequence[KVCacheGroupEdit],
    kv_layout: str | None,
) -> tuple[object, str | None, str | None]:
    """``(value after, rule that fired, why the rules before it declined)``;
    a rule's refusal, or a rule that returns anything but a view of the
    registered storage, raises :class:`_LayerRefusal`."""
    declined: list[str] = []
    for rule in rules:
        if rule.matches(spec, value):
            try:
                new_value = rule.apply(spec, value, kv_layout=kv_layout)
            except ValueError as exc:
                raise _LayerRefusal(
                    f"layer {name!r} (group {group}, rule {rule.name!r}): {exc}", rule.name,
                    str(exc),
                ) from exc
            if not _is_view_of(new_value, tensors_of(value)):
                copy = (f"returned {describe(new_value)} that does not share the registered "
                        "storage; expected a view, never a copy")
                raise _LayerRefusal(
                    f"rule {rule.name!r} returned {describe(new_value)} for layer {name!r} "
                    "that does not share the registered storage; expected a view, never a copy",
                    rule.name, copy,
                )
            return new_value, rule.name, "; ".join(declined) or None
        why = getattr(rule, "why_not", None)
        reason = why(spec, value) if callable(why) else None
        declined.append(f"{rule.name}: {reason or 'does not match'}")
    return value, None, "; ".join(declined) or None


def apply_kv_cache_group_edits(
    kv_cache_config: KVCacheConfig | None,
    kv_caches: Mapping[str, RegisteredKVCache],
    *,
    kv_layout: str | None = None,
    rules: Sequence[KVCacheGroupEdit] | None = None,
    lmcache: object = None,
) -> EditResult:
    """Re-view a registration as LMCache's ``apply_kv_cache_group_edits`` does.

    ``lmcache``: the LMCache release to answer for (``"0.5.2"``, ...; ``None``:
    the one installed beside kvexplore, else 0.5.6; see
    :mod:`kvexplore.editing.lmcache`): its validation, its rules in
    its order, its layout hint and the spec each rule sees (the group's, or
    each layer's own).  ``kv_caches`` (layer -> tensor, a legacy list of
    Mamba states, or a (K, V) pair of planes) is checked against
    ``kv_cache_config`` (a ``KVCacheConfig``, ``Plan`` or ``None``).  Without
    a config or Mamba layers no rule is consulted (as in LMCache); otherwise
    the first of ``rules`` (default: the release's) that matches a layer
    re-views it; ``kv_layout`` overrides the hint the release builds from the
    config's ``kv_cache_layout``.  Returns an :class:`EditResult` naming the
    release; no input is modified.  Refused: a release kvexplore does not
    know, group validation failures, a layout the release cannot hint,
    registration mismatches, a rule's invariant violation (prefixed with
    layer and rule), a copy.
    """
    release = lmcache_release(lmcache)
    plan = kv_cache_config if isinstance(kv_cache_config, Plan) else None
    kv_cache_config = as_kv_cache_config(kv_cache_config)
    validate_kv_cache_groups(kv_cache_config, lmcache=release)
    chosen = _check_rules(rules, release)
    where = check_registration(kv_cache_config, kv_caches)
    if plan is not None and (problems := registration_problems(plan, kv_caches)):
        raise KVExploreError(
            "cannot edit this registration: " + "; ".join(problems) + "."
        )
    if kv_cache_config is None:
        note = "no kv_cache_config: no rule consulted"
    elif not kv_cache_config.has_mamba_layers:
        note = "config has no Mamba layers: no rule consulted (as in LMCache)"
    else:
        note = ""
        kv_layout = layout_hint(
            release, kv_layout, getattr(kv_cache_config, "kv_cache_layout", None)
        )
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    edited: dict[str, RegisteredKVCache] = dict(kv_caches)
    rows = []
    for name, value in kv_caches.items():
        group, spec = where[name]
        new_value, rule, declined = value, None, note or None
        if not note:
            seen = _seen_spec(release, kv_cache_config, group, spec)
            try:
                new_value, rule, declined = _edit_layer(
                    name, group, seen, value, chosen, kv_layout
                )
            except KVExploreError as exc:
                raise KVExploreError(f"{release} refuses {exc}") from exc
            edited[name] = new_value  # type: ignore[assignment]
        rows.append(
            {
                "group": group,
                "layer": name,
                "kind": spec_kind(spec).value if spec is not None else None,
                "rule": rule,
                "declined": declined,
                **layout_facts(value, num_blocks, "before"),
                **layout_facts(new_value, num_blocks, "after"),
            }
        )
    report = pd.DataFrame(rows, columns=REPORT_COLUMNS, dtype=object)
    return EditResult(edited, report, note, lmcache=release.version)


def edit_each_layer(
    kv_cache_config: KVCacheConfig | None,
    kv_caches: Mapping[str, RegisteredKVCache],
    *,
    kv_layout: str | None = None,
    lmcache: object = None,
) -> dict[str, tuple[str | None, object, str | None]]:
    """Each layer on its own, as the release's rules treat it: ``{layer:
    (rule, value after, refusal)}`` (rule ``None``: no rule matched, the
    registered value is kept), in the config's group order.

    Each layer is edited as :func:`apply_kv_cache_group_edits` edits it (the
    same rules, spec and view check), but a layer's refusal does not stop
    the others: this says what each rule does to each group.  Refused before
    any layer: the release's validation, its layout hint and a registration
    that does not describe the config.  ``{}`` without Mamba layers (no rule
    is consulted)."""
    release = lmcache_release(lmcache)
    config = as_kv_cache_config(kv_cache_config)
    validate_kv_cache_groups(config, lmcache=release)
    where = check_registration(config, kv_caches)
    if config is None or not config.has_mamba_layers:
        return {}
    hint = layout_hint(release, kv_layout, getattr(config, "kv_cache_layout", None))
    rules = rules_for(release)
    out: dict[str, tuple[str | None, object, str | None]] = {}
    for group_index, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            if name not in kv_caches:
                continue
            spec = _seen_spec(release, config, group_index, where[name][1])
            try:
                value, rule, _ = _edit_layer(name, group_index, spec, kv_caches[name], rules,
                                             hint)
            except _LayerRefusal as exc:
                out[name] = (exc.rule, None, f"{exc.reason} (group {group_index})")
            else:
                out[name] = (rule, value, None)
    return out
