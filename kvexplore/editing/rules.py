"""LMCache 0.5.6's KV-cache group edits, re-implemented as explorable rules.

LMCache's ``apply_kv_cache_group_edits``
(``lmcache/integration/vllm/kv_cache_group_edits.py``) re-views a Mamba layer
or a kernel-paged attention layer block-shaped; every rule here returns a view
of the registered bytes (never a copy), refuses with the numbers and says why
it declined.  In priority order (first match wins), with Qwen3.5-0.8B's
shapes at 64 blocks (GDN page 1,114,112 B, block 544 = 17 kernel pages of 32):

* ``mamba-page-view`` (legacy): ``[conv (64, 3, 6144) bf16, ssm (64, 16, 128,
  128) fp32]`` -> ``[64, 2, 544, 1, 512]`` bf16 over each whole page;
* ``subpaged-attention-view`` (both): ``[1088, 2, 32, 2, 256]`` or unified
  ``[1088, 2, 32, 512]`` bf16 -> ``[64, 2, 544, 1, 512]``;
* ``mamba-unified-view`` (unified): ``[64, 1, 1, 1085440]`` int8 ->
  ``[64, 544, 1, 2000]``, strides ``(1114112, 2000, 2000, 1)`` for ``NHD``;
* ``subpaged-mla-attention-view`` (unified): ``[B * 12, 64, 576]`` under a
  768-token block -> ``[B, 768, 576]``.

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
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec, KVCacheSpecKind

from kvexplore.editing.registered import (
    REPORT_COLUMNS,
    EditResult,
    RegisteredKVCache,
    check_registration,
    describe,
    layout_facts,
    registration_problems,
    spec_kind,
    spec_page_bytes,
    tensors_of,
)
from kvexplore.editing.validation import (
    as_kv_cache_config,
    declares_slot_compression,
    validate_kv_cache_groups,
)
from kvexplore.errors import KVExploreError
from kvexplore.layout import cdiv, element_extent
from kvexplore.planning.planner import Plan

__all__ = [
    "DEFAULT_EDITS",
    "EditResult",
    "KVCacheGroupEdit",
    "MambaPageViewEdit",
    "MambaUnifiedViewEdit",
    "SubpagedAttentionViewEdit",
    "SubpagedMLAAttentionViewEdit",
    "apply_kv_cache_group_edits",
    "resolve_kv_layout",
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

# kv_layout hints: LMCache's names (``KV_LAYOUT_NAMES`` in
# lmcache/v1/gpu_connector/kv_format/types.py) plus vLLM's
# ``KVCacheLayout`` names, sorted by whether the token dim N sits outside the
# head dim H.
_TOKENS_OUTSIDE_HEADS = frozenset({"NHD", "BLNHC", "LBNHC"})
_HEADS_OUTSIDE_TOKENS = frozenset({"HND", "BLHNC", "LBHNC", "LHBNC", "BHLNC"})
KV_LAYOUT_HINTS = tuple(sorted(_TOKENS_OUTSIDE_HEADS | _HEADS_OUTSIDE_TOKENS))

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


def resolve_kv_layout(kv_layout: str | None) -> bool:
    """True when the hint (LMCache's or a vLLM ``KVCacheLayout`` name) puts
    tokens outside heads (``NHD``, ``LBNHC``); refuses ``None`` and unknown names."""
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
    its dtype.  Matches a ``list`` of states only (what vLLM registers; any
    other value is left as it is, as in LMCache).  Refused unless there is
    one tensor per ``MambaSpec.shapes`` entry, the conv state starts at its
    storage's first byte (LMCache re-strides from there), each state steps
    one page per block, the states sit back to back and the page factors.
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
        if not isinstance(kv_cache, list):
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
        if base_bytes:
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
        head = _synthetic_head_size(page_bytes, elem, spec.block_size)
        page_elems = page_bytes // elem
        shape = (num_blocks, 2, spec.block_size, _SYNTHETIC_NUM_HEADS, head)
        strides = (page_elems, spec.block_size * head, head, head, 1)
        return _checked_as_strided(conv, shape, strides, "mamba-page-view")


class SubpagedAttentionViewEdit(_ReasonedEdit):
    """Kernel-paged attention -> logical-block pages (``subpaged-attention-view``).

    LMCache's ``_SubpagedAttentionViewEdit``: the kernel pages of a block
    (``select_common_block_size``) become one ``[2, block_size, 1, h']`` page;
    a legacy rank-5 tensor must be contiguous in logical order, a unified
    rank-4 one in memory order.  ``kv_layout`` is not read.
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
                f"attention layer registered as {describe(kv_cache)}; expected "
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

    LMCache's ``_MambaUnifiedViewEdit``: the ``[B, 1, 1, row]`` int8 row is
    spread over ``block_size`` tokens of ``ceil(row / block_size)`` bytes,
    rounded up to the widest vector width (16, 8, 4, 2 B) dividing the page
    step that still fits the page: ``[B, block_size, 1, h]`` for an NHD-style
    hint, ``[B, 1, block_size, h]`` for HND.  Refused without a known hint,
    for a row that is not dense ``[blocks, 1, 1, row]``, or when no width fits.
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
                f"Mamba layer registered as {describe(kv_cache)}; expected a "
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
    page (slot compression stays intact), tiled as the attention rule does.
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


#: The registry, in priority order; first match wins.
DEFAULT_EDITS: tuple[KVCacheGroupEdit, ...] = (
    MambaPageViewEdit(),
    SubpagedAttentionViewEdit(),
    MambaUnifiedViewEdit(),
    SubpagedMLAAttentionViewEdit(),
)


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


def _is_view_of(view: object, sources: list[torch.Tensor]) -> bool:
    if not isinstance(view, torch.Tensor):
        return False
    ptr = view.untyped_storage().data_ptr()
    return any(
        t.untyped_storage().data_ptr() == ptr and t.device == view.device
        for t in sources
    )


def _edit_layer(
    name: str,
    group: int | None,
    spec: KVCacheSpec,
    value: RegisteredKVCache,
    rules: Sequence[KVCacheGroupEdit],
    kv_layout: str | None,
) -> tuple[object, str | None, str | None]:
    """``(value after, rule that fired, why the rules before it declined)``."""
    declined: list[str] = []
    for rule in rules:
        if rule.matches(spec, value):
            try:
                new_value = rule.apply(spec, value, kv_layout=kv_layout)
            except ValueError as exc:
                raise KVExploreError(
                    f"layer {name!r} (group {group}, rule {rule.name!r}): {exc}"
                ) from exc
            if not _is_view_of(new_value, tensors_of(value)):
                raise KVExploreError(
                    f"rule {rule.name!r} returned {describe(new_value)} "
                    f"for layer {name!r} that does not share the registered "
                    "storage; expected a view, never a copy"
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
) -> EditResult:
    """Re-view a registration as LMCache's ``apply_kv_cache_group_edits`` does.

    ``kv_caches`` (layer -> tensor, or legacy Mamba state list) is checked
    against ``kv_cache_config`` (a ``KVCacheConfig``, ``Plan`` or ``None``).
    Without a config or Mamba layers no rule is consulted (as in LMCache);
    otherwise the first of ``rules`` (default :data:`DEFAULT_EDITS`) that
    matches a layer re-views it; ``kv_layout`` defaults to the config's
    ``kv_cache_layout``.  Returns an :class:`EditResult`; no input is
    modified.  Refused: group validation failures, registration mismatches,
    a rule's invariant violation (prefixed with layer and rule), a copy.
    """
    plan = kv_cache_config if isinstance(kv_cache_config, Plan) else None
    kv_cache_config = as_kv_cache_config(kv_cache_config)
    validate_kv_cache_groups(kv_cache_config)
    chosen = _check_rules(rules)
    where = check_registration(kv_cache_config, kv_caches)
    if plan is not None and (problems := registration_problems(plan, kv_caches)):
        raise KVExploreError("cannot edit this registration: " + "; ".join(problems) + ".")
    if kv_cache_config is None:
        note = "no kv_cache_config: no rule consulted"
    elif not kv_cache_config.has_mamba_layers:
        note = "config has no Mamba layers: no rule consulted (as in LMCache)"
    else:
        note = ""
        if kv_layout is None:
            kv_layout = getattr(kv_cache_config, "kv_cache_layout", None)
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    edited: dict[str, RegisteredKVCache] = dict(kv_caches)
    rows = []
    for name, value in kv_caches.items():
        group, spec = where[name]
        new_value, rule, declined = value, None, note or None
        if not note:
            new_value, rule, declined = _edit_layer(
                name, group, spec, value, chosen, kv_layout
            )
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
    return EditResult(edited, report, note)
