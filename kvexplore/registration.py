"""Registered KV caches: what a KV connector's ``register_kv_caches`` receives.

Two eras:

``unified`` (vLLM >= 0.26): vLLM's own
``vllm/v1/worker/utils.py: allocate_kv_cache`` allocates one int8 backing
buffer and ``vllm/v1/kv_cache_interface.py: create_kv_cache_views`` cuts one
4-D ``[B, H, N, C]`` view per layer out of it (``C`` in the spec's dtype).
Qwen3.5-0.8B, 64 blocks, ``LBNHC``, kernel block 32 (FLASHINFER): a GDN layer
is ``[64, 1, 1, 1085440]`` int8, strides ``(1114112, 1085440, 1085440, 1)``;
an attention layer ``[1088, 2, 32, 512]`` bf16, strides ``(32768, 512, 1024, 1)``.

With the extensible KV cache of vLLM 0.34 (a plan whose
:attr:`~kvexplore.Plan.extensible_kv_cache` is true), a connector that reaches
the cache in process is handed the views vLLM rebuilds after its final commit
(``vllm/v1/worker/extensible_kv_cache.py: extend_kv_cache``): under a
layer-outermost block-compact layout (``LBNHC``, ``LBHNC``) every layer region
is its own storage of exactly the committed blocks (raw views ``uint8``), the
regions padded apart to 2 MiB granules (``pad_kv_cache_segments``); under
block-outermost layouts the layers share one storage.  A connector that
shares the cache through legacy CUDA IPC, or a cache given ``num_blocks`` /
``kv_cache_memory_bytes``, keeps the one-buffer registration above.

``legacy`` (vLLM < 0.26, what LMCache's first two edit rules were written for): each
``KVCacheTensor`` is shared by one layer of every group; an attention layer is
``[num_kernel_pages, 2, kernel_block, heads, head_size]`` (K/V dim second,
kernel pages contiguous inside a logical block); a Mamba layer is
``[conv_state, ssm_state]``, views into one padded page per block laid out
``conv | ssm | pad``, ``stride(0)`` = one page.
"""

from __future__ import annotations

import math

import torch

from kvexplore.errors import KVExploreError
from kvexplore.layout import page_bytes
from kvexplore.memo import per_plan
from kvexplore.planning import release
from kvexplore.planning.planner import require_plan
from kvexplore.planning.release import release_name

REGISTRATIONS = ("unified", "legacy")


def check_registration_name(registration) -> None:
    """Refuse a ``registration`` that is not one of :data:`REGISTRATIONS`."""
    if registration not in REGISTRATIONS:
        raise KVExploreError(
            f"registration={registration!r} is invalid; expected one of {list(REGISTRATIONS)}"
        )


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise KVExploreError(f"device={device!r} is not a torch device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise KVExploreError(f"device={device!r} asked for CUDA but no CUDA device is available")
    return dev


#: The largest allocation a tensor can describe (torch sizes are int64 bytes).
MAX_ALLOCATION_BYTES = (1 << 63) - 1


def backing_bytes(plan) -> int:
    """Bytes of the plan's backing allocation (the end of its last ``KVCacheTensor``)."""
    return max((t.offset + t.size for t in plan.tensors), default=0)


def check_allocatable(plan) -> None:
    """Refuse what cannot be allocated, naming it: not a plan, no blocks, or
    a backing allocation beyond what a tensor can hold."""
    require_plan(plan)
    if plan.num_blocks < 1:
        raise KVExploreError(
            f"the plan has num_blocks={plan.num_blocks}: there is nothing to allocate; "
            "expected num_blocks >= 1 (give num_blocks or more kv_cache_memory_bytes)"
        )
    total = backing_bytes(plan)
    if total > MAX_ALLOCATION_BYTES:
        raise KVExploreError(
            f"the plan's backing allocation is {total:,} B (block_size={plan.block_size:,}, "
            f"num_blocks={plan.num_blocks:,}); expected at most {MAX_ALLOCATION_BYTES:,} B, "
            "what a tensor can hold"
        )


def free_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device``: ``torch.cuda.mem_get_info`` on CUDA, the
    kernel's ``MemAvailable`` (``/proc/meminfo``) on the CPU; None where
    unknown (``meta`` holds no bytes)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def check_fits(plan, device: torch.device) -> None:
    """Refuse an allocation larger than what ``device`` has free, with the
    bytes, before torch's allocator is asked."""
    free = free_bytes(device)
    total = backing_bytes(plan)
    if free is not None and total > free:
        raise KVExploreError(
            f"the plan's backing allocation is {total:,} B (num_blocks={plan.num_blocks:,} "
            f"x {total // max(1, plan.num_blocks):,} B); {device} has {free:,} B free: expected "
            "fewer blocks (allocate(plan, num_blocks=16))"
        )


def allocate(plan, *, device="cpu", registration: str = "unified", num_blocks: int | None = None):
    """``{layer_name: tensor or [conv_state, ssm_state]}`` for ``plan``, or
    with ``num_blocks`` for ``plan.with_num_blocks(num_blocks)`` (the same
    layout with that many blocks: pass that plan's ``kv_cache_config`` to the
    edits).

    Allocates only what the caller asked for: a plan sized by vLLM's memory
    profile (:attr:`~kvexplore.Plan.sized_by_profile`, tens of GiB) is
    allocated on the ``meta`` device only, unless ``num_blocks`` is given.
    Raises ``KVExploreError`` for an unknown ``registration`` or ``device``, for
    what cannot be allocated (:func:`check_allocatable`) and for more bytes
    than the device has free (:func:`check_fits`)."""
    check_registration_name(registration)
    require_plan(plan)
    dev = _device(device)
    extensible = plan.extensible_kv_cache
    if num_blocks is not None:
        plan = plan.with_num_blocks(num_blocks)
    elif dev.type != "meta" and plan.sized_by_profile:
        raise KVExploreError(
            f"the plan's cache is sized for the {plan.gpu.name} deployment: "
            f"{plan.num_blocks:,} blocks, {backing_bytes(plan):,} B; allocating it on {dev} "
            "needs num_blocks: allocate(plan, num_blocks=16) (or "
            "allocate(plan.with_num_blocks(16))) allocates 16 blocks of the same layout"
        )
    check_allocatable(plan)
    check_fits(plan, dev)
    if registration == "unified" and extensible:
        return _allocate_extensible(plan, dev)
    if registration == "unified":
        from vllm.v1.worker.utils import allocate_kv_cache

        return allocate_kv_cache(
            plan.kv_cache_config, dev, plan.kv_cache_layout, list(plan.kernel_block_sizes)
        )
    return _allocate_legacy(plan, dev)


class _CommittedSegments:
    """Stands in for vLLM's ``ExtensibleTensor`` (device virtual memory): each
    segment is a plain tensor of exactly its committed bytes on ``device``."""

    def __init__(self, size, device=None, segment_capacities=(), export_handle_types=0):
        self.device = torch.device(device)
        self.capacities = list(segment_capacities) or [size]
        self.segments = [torch.empty(0, dtype=torch.uint8, device=self.device)
                         for _ in self.capacities]

    def resize_segments_(self, sizes, zero_new: bool = False) -> None:
        self.segments = [torch.zeros(n, dtype=torch.uint8, device=self.device) for n in sizes]

    def release_physical(self) -> None:
        self.resize_segments_([0] * len(self.capacities))

    def segments_backed_by_one_chunk(self, sizes) -> list[bool]:
        return [True] * len(sizes)

    def segment_view(self, index: int) -> torch.Tensor:
        return self.segments[index]

    @property
    def physical_bytes(self) -> int:
        return sum(t.numel() for t in self.segments)


def _allocate_extensible(plan, dev: torch.device):
    """What an in-process connector registers after the extensible cache's
    final commit of ``plan.num_blocks`` blocks: vLLM's own
    ``pad_kv_cache_segments``, ``ExtensibleKVCache.commit`` and
    ``committed_views`` over segments of plain tensors (CUDA's 2 MiB granule,
    ``vllm/utils/extensible_tensor.py: _MIN_GRANULARITY``).  A layout whose
    layers span several segments keeps its views over the whole allocation,
    as vLLM's runner does."""
    from vllm.utils import extensible_tensor
    from vllm.v1.worker.utils import allocate_kv_cache

    from kvexplore.planning.emulation import patch_attributes

    ext = release.extensible_cache_module()
    layout, kernels = plan.kv_cache_layout, list(plan.kernel_block_sizes)
    padded = ext.pad_kv_cache_segments(plan.kv_cache_config, layout,
                                       extensible_tensor._MIN_GRANULARITY)
    with patch_attributes([(ext, "ExtensibleTensor", _CommittedSegments)]):
        cache = ext.ExtensibleKVCache(padded, dev, layout)
    cache.commit(plan.num_blocks)
    views = cache.committed_views(padded, layout, kernels)
    if views is None:
        return allocate_kv_cache(padded, dev, layout, kernels)
    return views


def _allocate_legacy(plan, dev: torch.device):
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    cfg = plan.kv_cache_config
    num_blocks = cfg.num_blocks
    groups = cfg.kv_cache_groups
    if not groups:
        return {}
    # One backing buffer per layer position j, shared by layer j of every group
    # (the pre-0.26 KVCacheTensor: size = page bytes x num_blocks).
    width = max(len(g.layer_names) for g in groups)
    page = max(page_bytes(g.kv_cache_spec) for g in groups)
    out: dict = {}
    buffers = [torch.zeros(page * num_blocks, dtype=torch.int8, device=dev) for _ in range(width)]
    for gid, group in enumerate(groups):
        spec = group.kv_cache_spec
        kernel = plan.kernel_block_sizes[gid]
        for j, name in enumerate(group.layer_names):
            raw = buffers[j]
            if isinstance(spec, MambaSpec):
                out[name] = _legacy_mamba_views(raw, spec, num_blocks, page)
            elif isinstance(spec, AttentionSpec):
                out[name] = _legacy_attention_view(raw, spec, num_blocks, kernel)
            else:  # pragma: no cover - no other spec kinds are planned
                raise KVExploreError(f"legacy registration has no layout for {type(spec).__name__}")
    return out


def _legacy_attention_view(raw: torch.Tensor, spec, num_blocks: int, kernel_block: int):
    """``[num_blocks * ratio, 2, kernel_block, heads, head_size]`` contiguous."""
    ratio = spec.block_size // kernel_block
    heads, head = spec.num_kv_heads, spec.head_size
    elem = spec.dtype.itemsize
    if getattr(spec, "head_size_v", head) == 0:
        # MLA keeps one latent per token, no separate V: pre-0.26 vLLM
        # registered it as [num_kernel_pages, kernel_block, head_size].
        n = num_blocks * ratio * kernel_block * head
        return raw[: n * elem].view(spec.dtype).view(num_blocks * ratio, kernel_block, head)
    real = 2 * spec.block_size * heads * head * elem
    if page_bytes(spec) != real:
        # Padded or packed pages had no legacy kernel-paged form; keep one
        # page per block in the conventional shape with the real bytes first.
        view = raw[: num_blocks * page_bytes(spec)].view(spec.dtype)
        return view.as_strided(
            (num_blocks, 2, spec.block_size, heads, head),
            (page_bytes(spec) // elem, spec.block_size * heads * head, heads * head, head, 1),
        )
    n = num_blocks * ratio * 2 * kernel_block * heads * head
    return raw[: n * elem].view(spec.dtype).view(num_blocks * ratio, 2, kernel_block, heads, head)


def _legacy_mamba_views(raw: torch.Tensor, spec, num_blocks: int, page: int):
    """``[conv_state, ssm_state]``: views into ``conv | ssm | pad`` pages."""
    views = []
    offset = 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        elem = dtype.itemsize
        if offset % elem or page % elem:
            raise KVExploreError(
                f"state of dtype {dtype} at byte offset {offset} in a {page}-byte page "
                "is not element-aligned"
            )
        typed = raw.view(dtype)
        inner = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        views.append(
            torch.as_strided(
                typed,
                (num_blocks, *shape),
                (page // elem, *inner),
                storage_offset=offset // elem,
            )
        )
        offset += math.prod(shape) * elem
    return views


def registered_views(plan, registration: str = "unified") -> dict:
    """The registration of ``plan`` on the ``meta`` device, kept per plan:
    exactly the views :func:`allocate` makes (vLLM's own ``allocate_kv_cache``
    / ``create_kv_cache_views`` for ``unified``), with real shapes, strides
    and storage offsets but no memory.  vLLM's refusals become ``KVExploreError``."""
    check_registration_name(registration)

    def build():
        try:
            return allocate(plan, device="meta", registration=registration)
        except KVExploreError:
            raise
        except (ValueError, AssertionError, RuntimeError) as exc:
            raise KVExploreError(
                f"{release_name()} cannot register the KV cache of {plan.model.name} "
                f"({registration}, layout {plan.kv_cache_layout.name}): {exc}"
            ) from None

    return per_plan(plan, ("views", registration), build)
