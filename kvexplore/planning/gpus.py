"""The GPUs kvexplore answers for: vLLM picks the attention backend
(``CudaPlatformBase.get_attn_backend_cls``) and the GDN prefill kernel
(``qwen_gdn_linear_attn.py: _resolve_gdn_prefill_backend``), hence the block
size, from the device.  :func:`resolve_gpu` turns a name or a compute
capability into one row of this table.

>>> resolve_gpu("H100").compute_capability
'9.0'
>>> resolve_gpu("8.0").name
'A100'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from kvexplore.errors import KVExploreError

#: The GPU a plan answers for when none is named.
DEFAULT_GPU = "H100"

#: CUDA runtime major of the pinned wheels (``torch.version.cuda`` = 13.0).
CUDA_RUNTIME_MAJOR = 13


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One NVIDIA GPU: what vLLM's CUDA platform would report for it."""

    name: str
    device_name: str
    major: int
    minor: int
    memory_gib: int
    sm_count: int
    cuda_runtime_major: int = CUDA_RUNTIME_MAJOR
    aliases: tuple[str, ...] = ()
    #: ``torch.cuda.mem_get_info()``'s total as vLLM logs it (GiB, lowest and
    #: highest public reading; a log rounds to 0.01 GiB); None: unknown.
    total_memory_gib: tuple[float, float] | None = None
    total_memory_source: str = ""

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def memory_bytes(self) -> int:
        """The card's nominal memory (``memory_gib`` GiB)."""
        return self.memory_gib << 30

    @property
    def total_memory_range(self) -> tuple[int, int]:
        """``(low, high)`` bytes of ``torch.cuda.mem_get_info()``'s total (the
        readings +- 0.005 GiB of log rounding); nominal memory when unknown."""
        if self.total_memory_gib is None:
            return self.memory_bytes, self.memory_bytes
        low, high = self.total_memory_gib
        return int((low - 0.005) * (1 << 30)), int((high + 0.005) * (1 << 30))

    def __str__(self) -> str:
        return f"{self.name} (SM {self.compute_capability})"


_GPUS: tuple[GPU, ...] = (
    GPU(name="A100", device_name="NVIDIA A100-SXM4-80GB", major=8, minor=0,
        memory_gib=80, sm_count=108, aliases=("A100-80GB", "A100-SXM4-80GB"),
        total_memory_gib=(79.14, 79.25),
        total_memory_source='vLLM logs "(78.84/79.25 GiB)", "total_gpu_memory (79.25GiB)"; one reading 79.14 GiB'),
    GPU(name="A10G", device_name="NVIDIA A10G", major=8, minor=6,
        memory_gib=24, sm_count=80,
        total_memory_gib=(22.06, 22.06),
        total_memory_source='torch device listings "NVIDIA A10G (22.06 GiB)"'),
    GPU(name="RTX 3090", device_name="NVIDIA GeForce RTX 3090", major=8, minor=6,
        memory_gib=24, sm_count=82, aliases=("3090", "RTX3090"),
        total_memory_gib=(23.56, 23.58),
        total_memory_source='vLLM logs "total_gpu_memory=23.58GiB" (https://github.com/vllm-project/vllm/issues/10517), "(22.93/23.56 GiB)"'),
    GPU(name="L4", device_name="NVIDIA L4", major=8, minor=9,
        memory_gib=24, sm_count=58,
        total_memory_gib=(22.03, 22.03),
        total_memory_source='vLLM 0.29 log "Free memory on device (21.84/22.03 GiB)"'),
    GPU(name="L40S", device_name="NVIDIA L40S", major=8, minor=9,
        memory_gib=48, sm_count=142,
        total_memory_gib=(44.39, 44.42),
        total_memory_source='torch readings "L40S (44.39 GiB)", "(44.42 GiB usable)"'),
    GPU(name="RTX 4090", device_name="NVIDIA GeForce RTX 4090", major=8, minor=9,
        memory_gib=24, sm_count=128, aliases=("4090", "RTX4090"),
        total_memory_gib=(23.51, 23.51),
        total_memory_source='torch reading "RTX 4090 (23.51 GiB)"'),
    GPU(name="H100", device_name="NVIDIA H100 80GB HBM3", major=9, minor=0,
        memory_gib=80, sm_count=132, aliases=("H100-SXM", "H100-80GB"),
        total_memory_gib=(79.18, 79.22),
        total_memory_source='vLLM 0.19 logs "total_memory=79.19GiB" (llm-d-planner), 79.18 (llm-d-benchmark), 79.22 (https://github.com/vllm-project/vllm/pull/10511)'),
    GPU(name="H200", device_name="NVIDIA H200", major=9, minor=0,
        memory_gib=141, sm_count=132,
        total_memory_gib=(139.81, 139.81),
        total_memory_source='vLLM 0.10.2 log "Free memory on device (139.21/139.81 GiB)"'),
    GPU(name="B200", device_name="NVIDIA B200", major=10, minor=0,
        memory_gib=180, sm_count=148,
        total_memory_gib=(178.35, 178.36),
        total_memory_source='cudaGetDeviceProperties "178.35 GB" (https://github.com/pytorch/ao/pull/4002), vLLM "(177.66/178.36 GiB)" (https://github.com/vllm-project/vllm/pull/21489)'),
    GPU(name="RTX 5090", device_name="NVIDIA GeForce RTX 5090", major=12, minor=0,
        memory_gib=32, sm_count=170, aliases=("5090", "RTX5090"),
        total_memory_gib=(31.36, 31.40),
        total_memory_source='vLLM logs "total_gpu_memory (31.37GiB)" (https://github.com/vllm-project/vllm/issues/14452), "(30.27/31.4 GiB)"'),
    GPU(name="RTX PRO 6000", device_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        major=12, minor=0, memory_gib=96, sm_count=188, aliases=("RTX-PRO-6000",),
        total_memory_gib=(94.97, 94.97),
        total_memory_source='the Max-Q Workstation Edition reading "(79.12/94.97 GiB)" (same 96 GB); no Server Edition reading found'),
)


def _key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


_BY_NAME = {_key(alias): g for g in _GPUS for alias in (g.name, *g.aliases)}
_CAPABILITIES = sorted({g.compute_capability for g in _GPUS})


def gpus() -> pd.DataFrame:
    """The GPUs kvexplore can answer for, one row each: ``gpu`` (the name
    ``plan(gpu=...)`` takes), ``device_name``, ``compute_capability``,
    ``memory_gib`` (nominal), ``total_memory_gib`` (low and high
    ``torch.cuda.mem_get_info()`` total) with ``total_memory_source``,
    ``sm_count`` and ``cuda_runtime_major``."""
    columns = ("device_name", "compute_capability", "memory_gib", "total_memory_gib",
               "total_memory_source", "sm_count", "cuda_runtime_major")
    import pandas as pd

    return pd.DataFrame([{"gpu": g.name, **{c: getattr(g, c) for c in columns}} for g in _GPUS])


def _parse_capability(text: str) -> tuple[int, int] | None:
    parts = text.strip().lower().removeprefix("sm").strip(" _").split(".")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    if len(parts) == 1 and parts[0].isdigit() and len(parts[0]) in (2, 3):
        return int(parts[0][:-1]), int(parts[0][-1])
    return None


def _checked(gpu: GPU) -> GPU:
    """``gpu`` if its capability is one of the table's and its counts are >= 1."""
    if gpu.compute_capability not in _CAPABILITIES:
        raise KVExploreError(
            f"gpu={gpu!r}: compute capability {gpu.compute_capability} cannot be emulated; "
            f"expected one of the capabilities of kvexplore.gpus() ({', '.join(_CAPABILITIES)})"
        )
    for name in ("memory_gib", "sm_count", "cuda_runtime_major"):
        value = getattr(gpu, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KVExploreError(f"gpu={gpu!r}: {name}={value!r} is invalid; expected an "
                                 "integer >= 1")
    return gpu


def resolve_gpu(gpu: str | GPU) -> GPU:
    """The :class:`GPU` for a name (``"H100"``, ``"rtx 4090"``) or a compute
    capability (``"9.0"``, ``"sm90"``: the first card of the table with it); a
    capability with no card in the table is refused."""
    if isinstance(gpu, GPU):
        return _checked(gpu)
    if not isinstance(gpu, str) or not gpu.strip():
        raise KVExploreError(
            f"gpu={gpu!r} is invalid; expected a GPU name ({', '.join(g.name for g in _GPUS)}) "
            "or a compute capability such as '9.0'"
        )
    hit = _BY_NAME.get(_key(gpu))
    if hit is not None:
        return hit
    cap = _parse_capability(gpu)
    if cap is not None:
        for g in _GPUS:
            if (g.major, g.minor) == cap:
                return g
        raise KVExploreError(
            f"gpu={gpu!r}: compute capability {cap[0]}.{cap[1]} cannot be emulated; "
            f"kvexplore emulates the capabilities of the GPUs in kvexplore.gpus() "
            f"({', '.join(_CAPABILITIES)}), because vLLM also reads the device's SM count and "
            "memory, which a bare capability does not give"
        )
    raise KVExploreError(
        f"unknown gpu {gpu!r}; expected one of {[g.name for g in _GPUS]} "
        "or a compute capability such as '9.0' (see kvexplore.gpus())"
    )


__all__ = ["CUDA_RUNTIME_MAJOR", "DEFAULT_GPU", "GPU", "gpus", "resolve_gpu"]
