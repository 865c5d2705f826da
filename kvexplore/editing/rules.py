"""LMCache's KV-cache group edits, re-implemented as explorable rules.

A KV connector that moves pages with one attention-shaped copy kernel cannot
digest what vLLM registers for a hybrid model: a Mamba layer is a list of
state tensors (or, in vLLM >= 0.26, an opaque byte row), and an attention
layer paged at a *kernel* block size (32) smaller than the scheduler's block
(544 for Qwen3.5-0.8B) looks like 17 times as many blocks as the scheduler
hands out.  LMCache (``lmcache/integration/vllm/kv_cache_group_edits.py``,
``apply_kv_cache_group_edits``) therefore re-views each such layer, in place,
as something block-shaped.  A wrong re-view loses data silently, so every rule
here returns a *view* of the registered bytes (same untyped storage, never a
copy), checks its invariants and says why it declined.

Rules, in registry priority order (first match wins; the built-in rules match
disjoint inputs, so the order only matters for your own rule lists):

=============================  ========  ===========================================
``mamba-page-view``            legacy    ``[conv, ssm]`` list -> ``[B, 2, block, 1, h']``
``subpaged-attention-view``    both      kernel pages -> ``[B, 2, block, 1, h']``
``mamba-unified-view``         unified   ``[B, 1, 1, row]`` -> ``[B, block, 1, h]``
``subpaged-mla-attention-view`` unified  MLA kernel pages -> logical pages
=============================  ========  ===========================================

Worked numbers (Qwen3.5-0.8B, TP 1, 64 blocks): a GDN page is
1,085,440 B of state padded to 1,114,112 B; an attention block is 544 tokens;
the kernel pages at 32 tokens, so one block is 17 kernel pages.

* legacy attention ``[1088, 2, 32, 2, 256]`` bf16 -> ``[64, 2, 544, 1, 512]``;
* legacy GDN ``[conv (64, 3, 6144) bf16, ssm (64, 16, 128, 128) fp32]`` ->
  ``[64, 2, 544, 1, 512]`` bf16 over each whole 1,114,112-byte page;
* unified GDN ``[64, 1, 1, 1085440]`` int8, strides
  ``(1114112, 1085440, 1085440, 1)`` -> ``[64, 544, 1, 2000]`` int8, strides
  ``(1114112, 2000, 2000, 1)`` (hint ``NHD``);
* unified attention ``[1088, 2, 32, 512]`` bf16, strides
  ``(32768, 512, 1024, 1)`` -> ``[64, 2, 544, 1, 512]``, strides
  ``(557056, 278528, 512, 512, 1)``.

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

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import FrozenInstanceError
from typing import TypeAlias

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
)

from kvexplore.display import Displayable
from kvexplore.editing.validation import (
    as_kv_cache_config,
    declares_slot_compression,
    validate_kv_cache_groups,
)
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, dtype_name

__all__ = [
    "DEFAULT_EDITS",
    "EditResult",
    "KVCacheGroupEdit",
    "MambaPageViewEdit",
    "MambaUnifiedViewEdit",
    "RegisteredKVCache",
    "SubpagedAttentionViewEdit",
    "SubpagedMLAAttentionViewEdit",
    "apply_kv_cache_group_edits",
    "check_registration",
    "layer_spec",
    "resolve_kv_layout",
    "spec_kind",
    "spec_page_bytes",
    "tensors_of",
]

#: One registered cache value: a tensor, or one tensor per Mamba state
#: (``[conv_state, ssm_state]``) in the legacy registration.
RegisteredKVCache: TypeAlias = torch.Tensor | list[torch.Tensor]

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

# kv_layout hints: LMCache's names (``KV_LAYOUT_NAMES`` in
# lmcache/v1/gpu_connector/kv_format/types.py) plus vLLM 0.33's
# ``KVCacheLayout`` names (vllm/v1/kv_cache_layout.py), sorted by whether the
# token dim N sits outside the head dim H.
_TOKENS_OUTSIDE_HEADS = frozenset({"NHD", "BLNHC", "LBNHC"})
_HEADS_OUTSIDE_TOKENS = frozenset({"HND", "BLHNC", "LBHNC", "LHBNC", "BHLNC"})
KV_LAYOUT_HINTS = tuple(sorted(_TOKENS_OUTSIDE_HEADS | _HEADS_OUTSIDE_TOKENS))

# Token widths the transfer kernels vectorize by, widest first
# (LMCache 0.5.6 ``_MambaUnifiedViewEdit.apply``).
_VECTOR_ALIGN_BYTES = (16, 8, 4, 2)


# --------------------------------------------------------------------------
# Small pure helpers over shapes, strides and byte offsets
# --------------------------------------------------------------------------


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return (
            f"Tensor(shape={tuple(value.shape)}, stride={tuple(value.stride())}, "
            f"dtype={str(value.dtype).removeprefix('torch.')})"
        )
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
    """vLLM's kind of ``spec``; ``UNKNOWN`` for an object that is no spec.

    Rules call it from ``matches``, which must never raise (LMCache's
    contract), so a stray object answers ``UNKNOWN`` instead of a TypeError.
    """
    try:
        return get_kv_cache_spec_kind(spec)
    except Exception:  # a non-spec object: treat as unknown, never raise
        return KVCacheSpecKind.UNKNOWN


def spec_page_bytes(spec: KVCacheSpec) -> int:
    """``spec.page_size_bytes`` as an int (1,114,112 for a Qwen3.5-0.8B page).

    Raises:
        KVExploreError: the object has no usable page size.
    """
    try:
        return int(spec.page_size_bytes)
    except Exception as exc:
        raise KVExploreError(
            f"spec {type(spec).__name__} has no usable page_size_bytes ({exc}); "
            "expected a vLLM KVCacheSpec with a page size"
        ) from None


def _num_states(spec: KVCacheSpec) -> int:
    """Stored states per logical block (``spec.num_states`` in vLLM 0.33)."""
    num_states = getattr(spec, "num_states", None)
    if isinstance(num_states, int):
        return num_states
    return spec.block_size // getattr(spec, "compress_ratio", 1)


def _synthetic_head_size(page_bytes: int, elem_size: int, block_size: int) -> int:
    """The ``head_size'`` that makes ``[2, block_size, 1, head_size']`` one page.

    This is the tiling check every attention-shaped rule shares: the page
    must hold a whole number of elements, and that number must split into
    K/V halves of ``block_size`` rows.  Qwen3.5-0.8B: 1,114,112 B / 2 B =
    557,056 bf16 elements = 2 x 544 x 1 x 512.

    Raises:
        ValueError: the page does not factor, with the numbers.
    """
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


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _checked_as_strided(
    t: torch.Tensor,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int,
    what: str,
) -> torch.Tensor:
    """``t.as_strided`` that answers out-of-range with a ValueError.

    ``as_strided`` itself raises a ``RuntimeError`` when a view would reach
    past the storage; a user who feeds a short buffer should instead learn
    how many bytes the view needs.
    """
    last = storage_offset + sum(
        (n - 1) * s for n, s in zip(size, stride, strict=True) if n > 0
    )
    need = (last + 1) * t.element_size()
    have = _storage_bytes(t)
    if any(n == 0 for n in size):
        need = storage_offset * t.element_size()
    if need > have:
        raise KVExploreError(
            f"{what} needs bytes up to {need} of the storage, which holds only "
            f"{have}; expected the registered buffer to cover every page"
        )
    return t.as_strided(tuple(size), tuple(stride), storage_offset)


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """Permute ``t``'s dims outermost-first by stride (a view, never a copy).

    vLLM 0.33 registers a unified cache as a permute view of its physical
    layout (``create_kv_cache_views``: ``LBNHC`` puts N outside H), so pages
    tile by byte range only in memory order.  A size-1 dim that ties on
    stride goes innermost among the ties, as LMCache's
    ``attempt_permute_to_contiguous_view`` does.
    """
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
    """Shared invariant check of the two sub-paged rules.

    ``kv_cache`` is paged at ``kernel_rows = kv_cache.shape[rows_dim]`` rows;
    one logical block holds ``logical_rows``.  Checks, each with its numbers:
    the ratio is whole, the kernel-page count divides by it, ``ratio`` kernel
    pages tile the logical page exactly (an undeclared packed layout must not
    be re-viewed), and the pages are contiguous (in memory order for a
    unified permute view, in logical order otherwise).  Returns the tensor in
    the order to ``view`` from, and the number of logical blocks.
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


def resolve_kv_layout(kv_layout: str | None) -> bool:
    """True when the hint puts tokens outside heads (``NHD``-style).

    Accepts LMCache's ``NHD`` / ``HND`` / ``BLNHC`` / ``BLHNC`` and vLLM
    0.33's ``KVCacheLayout`` names (``LBNHC`` is NHD, ``LBHNC`` is HND).

    Raises:
        ValueError: ``None`` or an unknown name.
    """
    name = getattr(kv_layout, "name", kv_layout)
    if isinstance(name, str):
        key = name.upper()
        if key in _TOKENS_OUTSIDE_HEADS:
            return True
        if key in _HEADS_OUTSIDE_TOKENS:
            return False
    hint = (
        " (pass kv_layout=, or a KVCacheConfig whose kv_cache_layout is set)"
        if kv_layout is None
        else ""
    )
    raise KVExploreError(
        f"kv_layout={kv_layout!r} is not a known layout hint{hint}; expected one "
        f"of {', '.join(KV_LAYOUT_HINTS)}"
    )


# --------------------------------------------------------------------------
# The rule interface
# --------------------------------------------------------------------------


class KVCacheGroupEdit(ABC):
    """One structural re-view of a layer's registered KV cache.

    The contract LMCache's ``KVCacheGroupEdit`` states and kvexplore checks:
    ``matches`` decides from the vLLM spec and the registered value alone and
    has no side effects; ``apply`` returns a view of the same storage (never a
    copy) or raises ``ValueError`` with the numbers when the layout breaks the
    rule's invariants.  ``why_not`` is kvexplore's addition: it says why a rule
    declined, so a report can show every rule's reasoning.

    Subclass it to try a rule of your own and pass ``rules=[...]`` to
    :func:`apply_kv_cache_group_edits`.
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
    """Legacy Mamba page -> one attention-shaped page (``mamba-page-view``).

    vLLM < 0.26 registers a Mamba layer as one tensor per state, e.g.
    ``[conv_state (64, 3, 6144) bf16, ssm_state (64, 16, 128, 128) fp32]``
    for a Qwen3.5-0.8B GDN layer, all views into one padded page per block
    laid out ``conv | ssm | pad`` (36,864 + 1,048,576 + 28,672 = 1,114,112 B).
    A page is one state snapshot, which for caching behaves like one block of
    a sliding-window layer, so LMCache re-views the *whole* page from the
    conv state's base as ``[64, 2, 544, 1, 512]`` in the conv dtype.

    Invariants (LMCache's, plus what it takes for the whole page to be this
    layer's): one tensor per ``MambaSpec.shapes`` entry (2 for Mamba2/GDN,
    1 for a short-conv layer), conv state at a page base, every state's
    ``stride(0)`` one page, states back to back, and the page factors into
    ``2 x block_size`` rows.  The view's dims are addressing only: its bytes
    are conv | ssm | pad, not K/V.
    """

    name = "mamba-page-view"
    era = "legacy"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MAMBA:
            return f"spec kind is {kind.value}, not mamba"
        if isinstance(kv_cache, torch.Tensor):
            return (
                f"registered value is one {kv_cache.ndim}-D tensor (unified "
                "registration), not a legacy list of state tensors"
            )
        if not isinstance(kv_cache, (list, tuple)):
            return f"registered value is a {type(kv_cache).__name__}, not a list"
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
            not isinstance(kv_cache, (list, tuple))
            or len(kv_cache) != expected
            or not all(isinstance(t, torch.Tensor) for t in kv_cache)
        ):
            raise KVExploreError(
                f"Mamba layer registered as {_describe(kv_cache)}; expected a list "
                f"of {expected} tensors ([conv_state, ssm_state] per "
                "MambaSpec.shapes) in the legacy registration"
            )
        page_bytes = spec_page_bytes(spec)
        conv = kv_cache[0]
        elem = conv.element_size()
        base_bytes = conv.storage_offset() * elem
        if base_bytes % page_bytes:
            raise KVExploreError(
                f"Mamba conv state must start at a page base: its byte offset "
                f"{base_bytes} (storage_offset={conv.storage_offset()}) is not a "
                f"multiple of the {page_bytes}-byte page"
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
        head = _synthetic_head_size(page_bytes, elem, spec.block_size)
        page_elems = page_bytes // elem
        shape = (num_blocks, 2, spec.block_size, _SYNTHETIC_NUM_HEADS, head)
        strides = (page_elems, spec.block_size * head, head, head, 1)
        return _checked_as_strided(
            conv, shape, strides, conv.storage_offset(), "mamba-page-view"
        )


class SubpagedAttentionViewEdit(_ReasonedEdit):
    """Kernel-paged attention -> logical-block pages (``subpaged-attention-view``).

    vLLM aligns a hybrid model's attention block with the Mamba page
    (``_align_hybrid_block_size`` in vllm/platforms/interface.py: 544 tokens
    for Qwen3.5-0.8B) but the backend pages the tensor at a kernel block it
    supports (``select_common_block_size`` in vllm/v1/worker/utils.py: 32), so
    a connector would see 17x too many blocks.  The rule re-views the 17
    contiguous kernel pages of a block as one ``[2, 544, 1, h']`` page:

    * legacy rank 5 ``[1088, 2, 32, 2, 256]`` bf16 (logically contiguous) and
    * unified rank 4 ``[1088, 2, 32, 512]`` bf16 with strides
      ``(32768, 512, 1024, 1)`` (``LBNHC``: contiguous in memory order)

    both become ``[64, 2, 544, 1, 512]``, strides ``(557056, 278528, 512, 512,
    1)``.  Dims stop being semantic (K and V interleave per kernel page) but
    store and load share the mapping, so bytes round-trip.  ``kv_layout`` is
    not consulted: the output order is fixed.
    """

    name = "subpaged-attention-view"
    era = "both"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind not in _SUBPAGEABLE_KINDS:
            return f"spec kind is {kind.value}, not a standard-paged attention kind"
        if declares_slot_compression(spec):
            return "spec declares slot compression (compression path, not edited)"
        if not isinstance(kv_cache, torch.Tensor):
            return f"registered value is a {type(kv_cache).__name__}, not a tensor"
        if kv_cache.ndim not in (4, 5):
            return f"tensor is {kv_cache.ndim}-D; expected 5-D legacy or 4-D unified"
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
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim not in (4, 5):
            raise KVExploreError(
                f"attention layer registered as {_describe(kv_cache)}; expected "
                "(kernel_pages, 2, kernel_block, heads, head_size) or "
                "(kernel_pages, heads, kernel_block, K|V bytes)"
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

    vLLM >= 0.26 registers a Mamba layer as one int8 view ``[B, 1, 1, row]``
    from ``create_kv_cache_views``; the row is the concatenated states and
    ``stride(0)`` the page step (plus sibling layers' pages in a blocks-first
    layout).  LMCache 0.5.6 spreads the row over ``block_size`` tokens of
    ``h = ceil(row / block_size)`` bytes, rounded up to the widest vector width
    (16, 8, 4, 2 B) dividing the page step, as long as ``block_size * h`` still
    fits in this layer's own page (``spec.page_size_bytes``).

    Qwen3.5-0.8B: row 1,085,440 B, block 544 -> 1,996 -> 2,000 (16 B), and
    544 x 2,000 = 1,088,000 <= 1,114,112, so ``[64, 1, 1, 1085440]`` becomes
    ``[64, 544, 1, 2000]`` with strides ``(1114112, 2000, 2000, 1)`` for an
    NHD-style hint, ``[64, 1, 544, 2000]`` strides ``(1114112, 1088000, 2000,
    1)`` for HND-style.  The view spills 2,560 B into the page padding, never
    into a sibling's page.
    """

    name = "mamba-unified-view"
    era = "unified"

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
                f"Mamba layer registered as {_describe(kv_cache)}; expected a "
                "unified 4-D [blocks, 1, 1, row] tensor"
            )
        tokens_outside = resolve_kv_layout(kv_layout)
        num_blocks, heads, states, row = kv_cache.shape
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
        base = -(-row // block_size) if block_size > 0 else 0
        head = 0
        for align in _VECTOR_ALIGN_BYTES:
            if align % elem or step_bytes % align:
                continue
            unit = align // elem
            candidate = -(-base // unit) * unit
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
        return _checked_as_strided(
            kv_cache, shape, strides, kv_cache.storage_offset(), "mamba-unified-view"
        )


def _mla_rows_dim(kv_cache: torch.Tensor) -> int:
    """Dim holding the stored states of an MLA cache.

    Rank 3 is ``[B, states, C]``; rank 4 has one head slot before (HND,
    ``[B, 1, states, C]``) or after (NHD, ``[B, states, 1, C]``) the states.
    """
    if kv_cache.ndim == 4 and kv_cache.shape[2] == 1 and kv_cache.shape[1] != 1:
        return 1
    return kv_cache.ndim - 2


class SubpagedMLAAttentionViewEdit(_ReasonedEdit):
    """Kernel-paged MLA cache -> logical pages (``subpaged-mla-attention-view``).

    LMCache 0.5.6 added this for vLLM >= 0.26: an MLA latent cache paged at a
    kernel size (``[B * 12, 64, 576]`` under a 768-token block, or the
    unified ``[B * 17, 1, 32, 576]``) is re-viewed with ``spec.num_states``
    rows per page, e.g. ``[B, 768, 576]``.  Using ``num_states`` (block size
    over ``tokens_per_state``) keeps declared slot compression intact.  The
    tiling check is the one :class:`SubpagedAttentionViewEdit` uses.
    """

    name = "subpaged-mla-attention-view"
    era = "unified"

    def why_not(self, spec: KVCacheSpec, kv_cache: RegisteredKVCache) -> str | None:
        kind = spec_kind(spec)
        if kind != KVCacheSpecKind.MLA_ATTENTION:
            return f"spec kind is {kind.value}, not mla_attention"
        if not isinstance(kv_cache, torch.Tensor):
            return f"registered value is a {type(kv_cache).__name__}, not a tensor"
        if kv_cache.ndim not in (3, 4):
            return f"tensor is {kv_cache.ndim}-D; expected 3-D or 4-D MLA pages"
        rows = kv_cache.shape[_mla_rows_dim(kv_cache)]
        if rows == _num_states(spec):
            return f"already paged at the logical {rows} states per block"
        return None

    def apply(
        self,
        spec: KVCacheSpec,
        kv_cache: RegisteredKVCache,
        *,
        kv_layout: str | None = None,
    ) -> torch.Tensor:
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.ndim not in (3, 4):
            raise KVExploreError(
                f"MLA layer registered as {_describe(kv_cache)}; expected "
                "[pages, states, C] or [pages, 1, states, C] / [pages, states, 1, C]"
            )
        rows_dim = _mla_rows_dim(kv_cache)
        if kv_cache.ndim == 4 and kv_cache.shape[3 - rows_dim] != 1:
            raise KVExploreError(
                f"MLA tensor {tuple(kv_cache.shape)} has "
                f"{kv_cache.shape[3 - rows_dim]} head slots; expected 1"
            )
        num_states = _num_states(spec)
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


#: The registry, in priority order; first match wins.
DEFAULT_EDITS: tuple[KVCacheGroupEdit, ...] = (
    MambaPageViewEdit(),
    SubpagedAttentionViewEdit(),
    MambaUnifiedViewEdit(),
    SubpagedMLAAttentionViewEdit(),
)


# --------------------------------------------------------------------------
# Applying the registry to a whole registration
# --------------------------------------------------------------------------


def layer_spec(group_spec: KVCacheSpec, layer_name: str) -> KVCacheSpec:
    """The spec of one layer: unwraps ``UniformTypeKVCacheSpecs``."""
    per_layer = getattr(group_spec, "kv_cache_specs", None)
    if isinstance(per_layer, dict) and layer_name in per_layer:
        return per_layer[layer_name]
    return group_spec


def tensors_of(value: RegisteredKVCache) -> list[torch.Tensor]:
    """A registered value's tensors: ``[t]`` for a tensor, the states of a list."""
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _layout_facts(value: object) -> dict[str, object]:
    """shape / stride / storage offset / dtype of a value, for the report."""
    if isinstance(value, torch.Tensor):
        return {
            "shape": tuple(value.shape),
            "stride": tuple(value.stride()),
            "storage_offset": value.storage_offset(),
            "dtype": dtype_name(value.dtype),
        }
    if isinstance(value, (list, tuple)) and all(
        isinstance(t, torch.Tensor) for t in value
    ):
        return {
            "shape": tuple(tuple(t.shape) for t in value),
            "stride": tuple(tuple(t.stride()) for t in value),
            "storage_offset": tuple(t.storage_offset() for t in value),
            "dtype": tuple(dtype_name(t.dtype) for t in value),
        }
    return {"shape": None, "stride": None, "storage_offset": None, "dtype": None}


_REPORT_COLUMNS = [
    "group",
    "layer",
    "kind",
    "rule",
    "declined",
    "shape_before",
    "stride_before",
    "storage_offset_before",
    "dtype_before",
    "shape_after",
    "stride_after",
    "storage_offset_after",
    "dtype_after",
    "block_bytes_before",
    "block_bytes_after",
]

_BY_GROUP_COLUMNS = [
    "group",
    "kind",
    "rule",
    "layers",
    "shape_before",
    "shape_after",
    "block_bytes_before",
    "block_bytes_after",
]


def _block_bytes(value: object, num_blocks: int | None) -> int | None:
    """Bytes one block's view addresses: all elements over ``num_blocks``.

    Qwen3.5-0.8B: the registered attention ``[1088, 2, 32, 512]`` bf16 over
    64 blocks and the edited ``[64, 2, 544, 1, 512]`` are both 1,114,112 B
    per block; the unified GDN row is 1,085,440 B before and 1,088,000 B
    after (544 x 2,000, the 2,560 B spill into the page padding).
    """
    if not num_blocks:
        return None
    tensors = [value] if isinstance(value, torch.Tensor) else value
    if not isinstance(tensors, (list, tuple)) or not all(
        isinstance(t, torch.Tensor) for t in tensors
    ):
        return None
    return sum(t.numel() * t.element_size() for t in tensors) // num_blocks


class EditResult(Displayable, FrozenDict):
    """The edited ``{layer_name: value}`` dict, plus what happened per layer.

    It *is* the new dict (edited layers re-viewed, the others the very same
    objects as in the input), so it can be handed on wherever the plain result
    of LMCache's ``apply_kv_cache_group_edits`` would go.  It is frozen: no
    item or attribute can be set (``TypeError`` / ``FrozenInstanceError``), so
    the views and the report that describes them cannot drift apart
    (``dict(result)`` is a mutable copy; ``copy`` keeps the very views).

    ``report`` (a new DataFrame on every access) has one row per layer:
    group, layer, spec kind, the rule that matched (or ``None``), why every
    earlier rule declined, shape / stride / storage offset / dtype and bytes
    per block before and after.  ``counts`` maps rule name to layers;
    :meth:`by_group` condenses the report to one row per group and rule.
    """

    __slots__ = ("_rows", "_counts", "_note")

    def __init__(
        self,
        edited: Mapping[str, RegisteredKVCache],
        report: pd.DataFrame,
        note: str = "",
    ) -> None:
        dict.__init__(self, edited)
        rows = tuple(report.to_dict("records"))
        counts: Counter[str] = Counter(
            row["rule"] for row in rows if isinstance(row["rule"], str)
        )
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_counts", dict(counts))
        object.__setattr__(self, "_note", str(note))

    # -- frozen ------------------------------------------------------------
    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r} of EditResult")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r} of EditResult")

    def __reduce__(self):
        return (EditResult, (dict(self), self.report, self._note))

    def __copy__(self) -> EditResult:
        return self

    def __deepcopy__(self, memo: dict) -> EditResult:
        return self

    # -- data --------------------------------------------------------------
    @property
    def report(self) -> pd.DataFrame:
        """One row per layer (a new DataFrame each time: edit it freely)."""
        return pd.DataFrame(list(self._rows), columns=_REPORT_COLUMNS, dtype=object)

    @property
    def counts(self) -> dict[str, int]:
        """Rule name -> layers it re-viewed (a copy)."""
        return dict(self._counts)

    @property
    def note(self) -> str:
        """Why no rule was consulted, or ``""``."""
        return self._note

    def by_group(self) -> pd.DataFrame:
        """One row per group and rule that fired (``None``: no rule).

        Columns: ``group``, ``kind``, ``rule``, ``layers`` (how many of the
        group's layers that rule re-viewed), the first such layer's
        ``shape_before`` / ``shape_after`` and bytes per block before and
        after.  Qwen3.5-0.8B unified, 64 blocks: groups 0-2
        ``mamba-unified-view`` x 6, ``(64, 1, 1, 1085440)`` ->
        ``(64, 544, 1, 2000)``; group 3 ``subpaged-attention-view`` x 6,
        ``(1088, 2, 32, 512)`` -> ``(64, 2, 544, 1, 512)``.
        """
        seen: dict[tuple[object, object], dict[str, object]] = {}
        for row in self._rows:
            key = (row["group"], row["rule"])
            if key in seen:
                seen[key]["layers"] += 1
                continue
            seen[key] = {
                "group": row["group"],
                "kind": row["kind"],
                "rule": row["rule"],
                "layers": 1,
                "shape_before": row["shape_before"],
                "shape_after": row["shape_after"],
                "block_bytes_before": row["block_bytes_before"],
                "block_bytes_after": row["block_bytes_after"],
            }
        return pd.DataFrame(list(seen.values()), columns=_BY_GROUP_COLUMNS, dtype=object)

    def summary(self) -> str:
        """One line: layers, and how many each rule re-viewed."""
        if self._counts:
            rules = ", ".join(
                f"{name} x{n}" for name, n in sorted(self._counts.items())
            )
        else:
            rules = "no layer edited"
        extra = f"; {self._note}" if self._note else ""
        return f"EditResult({len(self)} layers: {rules}{extra})"

    def __repr__(self) -> str:
        return self.text()


def _check_rules(rules: object) -> tuple[KVCacheGroupEdit, ...]:
    if rules is None:
        return DEFAULT_EDITS
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


#: What a unified Mamba layer is registered as: ``create_kv_cache_views``
#: views the raw int8 buffer without a dtype (a Mamba spec has ``dtypes``,
#: not ``dtype``), so the row is bytes.
_UNIFIED_MAMBA_DTYPES = (torch.int8, torch.uint8)



def _dtype_problems(
    name: str, spec: KVCacheSpec, tensors: list[torch.Tensor]
) -> list[str]:
    """Where a layer's tensors are not in the dtype its spec registers.

    vLLM views an attention or MLA page in ``spec.dtype`` (bf16 for
    Qwen3.5-0.8B's ``[1088, 2, 32, 512]``), a legacy Mamba state ``i`` in
    ``spec.dtypes[i]`` (bf16 conv, fp32 SSM) and a unified Mamba row as int8
    bytes.  A tensor in another dtype (an fp16 view of the bf16 cache) has
    other element sizes and meanings, so an edit of it would describe a
    different cache; it is refused, naming both dtypes.
    """
    problems: list[str] = []
    if spec_kind(spec) == KVCacheSpecKind.MAMBA:
        if len(tensors) == 1 and tensors[0].ndim == 4:
            got = tensors[0].dtype
            if got not in _UNIFIED_MAMBA_DTYPES:
                problems.append(
                    f"Mamba layer {name!r} is a {dtype_name(got)} tensor; expected "
                    "int8 bytes, as create_kv_cache_views registers a unified "
                    "Mamba row"
                )
            return problems
        wanted = tuple(getattr(spec, "dtypes", ()) or ())
        for index, (state, dtype) in enumerate(zip(tensors, wanted, strict=False)):
            if state.dtype != dtype:
                problems.append(
                    f"Mamba layer {name!r} state {index} is {dtype_name(state.dtype)}; "
                    f"expected {dtype_name(dtype)} (MambaSpec.dtypes[{index}])"
                )
        return problems
    wanted_dtype = getattr(spec, "dtype", None)
    if isinstance(wanted_dtype, torch.dtype):
        for tensor in tensors:
            if tensor.dtype != wanted_dtype:
                problems.append(
                    f"layer {name!r} is registered as {dtype_name(tensor.dtype)}; "
                    f"expected {dtype_name(wanted_dtype)}, the dtype of its "
                    f"{type(spec).__name__}"
                )
                break
    return problems


def check_registration(
    kv_cache_config: KVCacheConfig | None, kv_caches: object
) -> dict[str, tuple[int | None, KVCacheSpec | None]]:
    """Validate the registration against the config; return layer -> (group, spec).

    Collects every problem (missing / extra layers, values that are not
    tensors or tensor lists, tensors not in their spec's dtype, mixed
    devices, malformed Mamba entries) into one error, before anything is
    edited.  :func:`apply_kv_cache_group_edits` and
    :func:`kvexplore.verify_roundtrip` both start here.

    Raises:
        KVExploreError: listing every problem, each naming its layer.
    """
    kv_cache_config = as_kv_cache_config(kv_cache_config)
    if not isinstance(kv_caches, Mapping):
        raise KVExploreError(
            f"kv_caches is a {type(kv_caches).__name__}; expected a mapping of "
            "layer name -> tensor or [conv_state, ssm_state]"
        )
    problems: list[str] = []
    where: dict[str, tuple[int | None, KVCacheSpec | None]] = {}
    if kv_cache_config is not None:
        for index, group in enumerate(kv_cache_config.kv_cache_groups):
            for name in group.layer_names:
                where[name] = (index, layer_spec(group.kv_cache_spec, name))
        missing = [name for name in where if name not in kv_caches]
        extra = [name for name in kv_caches if name not in where]
        if missing:
            problems.append(
                f"kv_caches lacks {len(missing)} layer(s) the config names: "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}"
            )
        if extra:
            problems.append(
                f"kv_caches holds {len(extra)} layer(s) no config group names: "
                f"{extra[:8]}{' ...' if len(extra) > 8 else ''}"
            )
    devices: dict[str, list[str]] = {}
    for name, value in kv_caches.items():
        if not where:
            where[name] = (None, None)
        tensors = (
            [value]
            if isinstance(value, torch.Tensor)
            else list(value)
            if isinstance(value, (list, tuple))
            else None
        )
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            problems.append(
                f"layer {name!r} is registered as {_describe(value)}; expected a "
                "tensor or a non-empty list of tensors"
            )
            continue
        for device in dict.fromkeys(str(t.device) for t in tensors):
            devices.setdefault(device, []).append(name)
        _, spec = where.get(name, (None, None))
        if spec is not None:
            problems.extend(_dtype_problems(name, spec, tensors))
        if spec is not None and spec_kind(spec) == KVCacheSpecKind.MAMBA:
            expected = len(getattr(spec, "shapes", ())) or 2
            if isinstance(value, (list, tuple)) and len(value) != expected:
                problems.append(
                    f"Mamba layer {name!r} is a list of {len(value)} tensors; "
                    f"expected {expected} ([conv_state, ssm_state] per "
                    "MambaSpec.shapes) in the legacy registration"
                )
            elif isinstance(value, torch.Tensor) and value.ndim != 4:
                problems.append(
                    f"Mamba layer {name!r} is one {value.ndim}-D tensor "
                    f"{tuple(value.shape)}; expected a legacy list of {expected} "
                    "state tensors or a unified 4-D [blocks, 1, 1, row] view"
                )
    if len(devices) > 1:
        listed = ", ".join(
            f"{device}: {names[:3]}{' ...' if len(names) > 3 else ''}"
            for device, names in sorted(devices.items())
        )
        problems.append(
            f"registered tensors live on {len(devices)} devices ({listed}); "
            "expected one device"
        )
    if problems:
        raise KVExploreError(
            "cannot edit this registration: " + "; ".join(problems) + "."
        )
    return where


def _is_view_of(view: object, sources: list[torch.Tensor]) -> bool:
    if not isinstance(view, torch.Tensor):
        return False
    ptr = view.untyped_storage().data_ptr()
    return any(
        t.untyped_storage().data_ptr() == ptr and t.device == view.device
        for t in sources
    )


def apply_kv_cache_group_edits(
    kv_cache_config: KVCacheConfig | None,
    kv_caches: Mapping[str, RegisteredKVCache],
    *,
    kv_layout: str | None = None,
    rules: Sequence[KVCacheGroupEdit] | None = None,
) -> EditResult:
    """Re-view a registration the way LMCache's ``apply_kv_cache_group_edits`` does.

    Validates the groups first (:func:`kvexplore.validate_kv_cache_groups`),
    then checks the registration against the config (every layer present,
    nothing extra, one device, well-formed Mamba entries).  A config without
    Mamba layers, or ``None``, comes back as a copy of the mapping: LMCache
    only consults the rules for Mamba-hybrid models.  Otherwise each layer is
    offered to ``rules`` (default :data:`DEFAULT_EDITS`) in order; the first
    match re-views it, the rest stay the very same objects.  Nothing is
    written and no input is modified, also when an error is raised.

    Args:
        kv_cache_config: vLLM ``KVCacheConfig`` (per-group specs) or ``None``.
        kv_caches: layer name -> tensor, or list of state tensors (legacy
            Mamba).
        kv_layout: layout hint for ``mamba-unified-view`` (``"NHD"``,
            ``"HND"``, ``"BLNHC"``, ``"BLHNC"`` or a vLLM ``KVCacheLayout``
            name).  ``None`` takes ``kv_cache_config.kv_cache_layout``, the
            layout vLLM's engine resolved.
        rules: your own rule list to explore; ``None`` for the registry.

    Returns:
        :class:`EditResult`: the new dict, with ``.report`` per layer.

    Raises:
        ValueError: validation failures, registration/config mismatches, or a
            rule's invariant violation, prefixed with the layer and rule.
    """
    kv_cache_config = as_kv_cache_config(kv_cache_config)
    validate_kv_cache_groups(kv_cache_config)
    chosen = _check_rules(rules)
    where = check_registration(kv_cache_config, kv_caches)
    if kv_layout is None and kv_cache_config is not None:
        kv_layout = getattr(kv_cache_config, "kv_cache_layout", None)

    consult = kv_cache_config is not None and kv_cache_config.has_mamba_layers
    if kv_cache_config is None:
        note = "no kv_cache_config: no rule consulted"
    elif not consult:
        note = "config has no Mamba layers: no rule consulted (as in LMCache)"
    else:
        note = ""

    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    edited: dict[str, RegisteredKVCache] = dict(kv_caches)
    rows = []
    for name, value in kv_caches.items():
        group, spec = where.get(name, (None, None))
        row: dict[str, object] = {
            "group": group,
            "layer": name,
            "kind": spec_kind(spec).value if spec is not None else None,
            "rule": None,
            "declined": note or None,
        }
        declined: list[str] = []
        new_value: object = value
        if consult and spec is not None:
            for rule in chosen:
                if rule.matches(spec, value):
                    try:
                        new_value = rule.apply(spec, value, kv_layout=kv_layout)
                    except ValueError as exc:
                        raise KVExploreError(
                            f"layer {name!r} (group {group}, rule {rule.name!r}): {exc}"
                        ) from exc
                    if not _is_view_of(new_value, tensors_of(value)):
                        raise KVExploreError(
                            f"rule {rule.name!r} returned {_describe(new_value)} "
                            f"for layer {name!r} that does not share the registered "
                            "storage; expected a view, never a copy"
                        )
                    row["rule"] = rule.name
                    edited[name] = new_value  # type: ignore[assignment]
                    break
                why = getattr(rule, "why_not", None)
                reason = why(spec, value) if callable(why) else None
                declined.append(f"{rule.name}: {reason or 'does not match'}")
            row["declined"] = "; ".join(declined) or None
        for suffix, source in (("before", value), ("after", new_value)):
            for key, fact in _layout_facts(source).items():
                row[f"{key}_{suffix}"] = fact
            row[f"block_bytes_{suffix}"] = _block_bytes(source, num_blocks)
        rows.append(row)
    report = pd.DataFrame(rows, columns=_REPORT_COLUMNS, dtype=object)
    return EditResult(edited, report, note)
