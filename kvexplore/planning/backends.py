"""Attention backend names, as vLLM's ``--attention-backend`` takes them.

A named backend must be a member of vLLM's ``AttentionBackendEnum``
(``vllm/v1/attention/backends/registry.py``); whether it suits the model and
GPU is decided by vLLM when the layers are built.
"""

from __future__ import annotations

from kvexplore.errors import KVExploreError
from kvexplore.planning.release import release_name

#: Backends people name most on NVIDIA GPUs (the Explorer's choices).
COMMON_BACKENDS = (
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "FLASH_ATTN_MLA",
    "FLASHMLA",
    "FLASHINFER_MLA",
    "TRITON_MLA",
    "CUTLASS_MLA",
)


def backend_names() -> tuple[str, ...]:
    """Every name vLLM's ``--attention-backend`` accepts."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return tuple(AttentionBackendEnum.__members__)


#: Name prefixes of the backends of vLLM's other platforms (CPU, ROCm, XPU):
#: vLLM's CUDA platform does not refuse them by name, but they do not run there.
OTHER_PLATFORMS = ("CPU_", "ROCM_", "XPU_", "AMX_")


def validate_backend_name(name) -> str:
    """``name`` if vLLM's ``AttentionBackendEnum`` has it and it is not another
    platform's backend (:data:`OTHER_PLATFORMS`); a clear error if not."""
    names = backend_names()
    if not isinstance(name, str) or name.upper() not in names:
        raise KVExploreError(
            f"unknown attention_backend {name!r}; expected one of {release_name()}'s "
            f"AttentionBackendEnum names: {list(names)}"
        )
    if name.upper().startswith(OTHER_PLATFORMS):
        cuda = [n for n in names if not n.startswith(OTHER_PLATFORMS)]
        raise KVExploreError(
            f"attention_backend={name!r} is a backend of vLLM's CPU, ROCm or XPU platform, "
            f"not of the NVIDIA GPUs kvexplore answers for; expected one of {cuda}"
        )
    return name.upper()


__all__ = ["COMMON_BACKENDS", "OTHER_PLATFORMS", "backend_names", "validate_backend_name"]
