"""Attention backend profiles, taken from vLLM 0.33's own backend classes.

A profile is the real backend class (``vllm.v1.attention.backends.*``), looked
up through vLLM's ``AttentionBackendEnum``.  Its
``get_supported_kernel_block_sizes`` / ``get_preferred_block_size`` /
``customize_spec`` are what the platform's block-size alignment
(``Platform.update_block_size_for_backend``) and the worker's kernel block
choice (``vllm/v1/worker/utils.py: prepare_kernel_block_sizes``) read.

Offline, vLLM's ``current_platform`` is the unspecified platform, so
capability-dependent answers are those of a GPU *without* FA4 (compute
capability < 10: Ampere, Hopper): ``FLASH_ATTN`` -> ``[MultipleOf(16)]``
(``flash_attn.py: FlashAttentionBackend.get_supported_kernel_block_sizes``),
``FLASHINFER`` -> ``[16, 32, 64]`` (``flashinfer.py``), ``TRITON_ATTN`` ->
``[MultipleOf(16)]`` (``triton_attn.py``), ``CPU_ATTN`` -> ``[MultipleOf(32)]``
(``cpu_attn.py``).

MLA models run MLA backends; a non-MLA profile name maps to its MLA sibling
(``FLASH_ATTN`` -> ``FLASHMLA``, ``FLASHINFER`` -> ``FLASHINFER_MLA``,
``TRITON_ATTN`` -> ``TRITON_MLA``, ``CPU_ATTN`` -> ``CPU_MLA``).
"""

from __future__ import annotations

from functools import cache

from kvexplore.errors import KVExploreError

#: Backends a plan can name (``attention_backend=``), as vLLM spells them.
ATTENTION_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN")
MLA_BACKENDS = ("FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "CPU_MLA")
_ALIASES = {"CPU": "CPU_ATTN", "FLASH_ATTENTION": "FLASH_ATTN", "TRITON": "TRITON_ATTN"}
_MLA_SIBLING = dict(zip(ATTENTION_BACKENDS, MLA_BACKENDS, strict=True))


def normalize_backend_name(name: str) -> str:
    """Canonical vLLM name for ``name``; raise listing valid names."""
    if not isinstance(name, str):
        raise KVExploreError(
            f"attention_backend={name!r} must be a string, one of "
            f"{list(ATTENTION_BACKENDS + MLA_BACKENDS)}"
        )
    key = _ALIASES.get(name.upper(), name.upper())
    if key not in ATTENTION_BACKENDS + MLA_BACKENDS:
        raise KVExploreError(
            f"unknown attention_backend {name!r}; expected one of "
            f"{list(ATTENTION_BACKENDS + MLA_BACKENDS)}"
        )
    return key


def resolve_backend_name(name: str, use_mla: bool) -> str:
    """The backend vLLM would run for this profile and model kind."""
    key = normalize_backend_name(name)
    if use_mla and key in _MLA_SIBLING:
        return _MLA_SIBLING[key]
    if not use_mla and key in MLA_BACKENDS:
        raise KVExploreError(
            f"attention_backend {name!r} is an MLA backend but the model does not "
            f"use MLA; expected one of {list(ATTENTION_BACKENDS)}"
        )
    return key


@cache
def backend_class(name: str):
    """vLLM's backend class for a canonical backend name."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def kernel_block_sizes_text(cls) -> str:
    """Human form of ``get_supported_kernel_block_sizes``, e.g. ``MultipleOf(16)``."""
    return ", ".join(str(s) for s in cls.get_supported_kernel_block_sizes())
