"""Host-memory sizing of vLLM's native CPU offloading, and LMCache chunk sizes.

:func:`host_sizing` computes from an ``OffloadingConfig`` and
``cpu_bytes_to_use`` what ``CPUOffloadingSpec.__init__``
(``vllm/v1/kv_offload/cpu/spec.py``) does, in its order: ``num_copies`` (1
when ``replicated_layout`` holds, else ``world_size``), ``kv_bytes_per_chunk``,
that rounded up to ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``
(``mmap.PAGESIZE``), and ``num_chunks``.  A chunk holds ``blocks_per_chunk``
blocks of *one* group, every rank's copy (``offloading/scheduler.py:
make_offload_key(req_block_hash, group_idx)``), so a span of context costs one
chunk per offloaded group.  Qwen3.5-0.8B on an A100 (4 groups, block 544):

>>> from kvexplore import plan, offload_config
>>> h = host_sizing(offload_config(plan("Qwen/Qwen3.5-0.8B", gpu="A100")), 10 << 30)
>>> h.aligned_kv_bytes_per_chunk, h.num_chunks, h.chunks_per_span, h.tokens
(6684672, 1606, 4, 218144)
"""

from __future__ import annotations

import dataclasses
import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, cdiv, check_int
from kvexplore.offloading.config import OffloadResult
from kvexplore.planning.release import release_name

#: ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`` (``mmap.PAGESIZE``) on this host.
HOST_PAGE_ALIGNMENT = mmap.PAGESIZE


def _check_result(result) -> None:
    if not isinstance(result, OffloadResult):
        raise KVExploreError(
            f"result={type(result).__name__} is invalid; expected the OffloadResult "
            "kvexplore.offload_config(plan) returns"
        )


@dataclass(frozen=True, kw_only=True)
class HostSizing(Displayable):
    """How much context the CPU tier holds (:func:`host_sizing`), each
    number's rule in ``derivation``.  ``tokens`` is what the ``num_chunks``
    chunks hold in whole spans (``span_tokens`` tokens cost ``chunks_per_span``
    chunks); ``gpu_bytes_per_token_one_group`` is one rank's block bytes over
    the block size (the figure host memory is wrongly scaled by).
    """

    cpu_bytes_to_use: int
    world_size: int
    num_copies: int
    replicated_layout: bool
    blocks_per_chunk: int
    worker_kv_bytes_per_block: int
    kv_bytes_per_chunk: int
    alignment: int
    aligned_kv_bytes_per_chunk: int
    num_chunks: int
    group_tokens_per_chunk: tuple[int, ...]
    span_tokens: int
    chunks_per_span: int
    tokens: int
    host_bytes_per_block: float
    host_bytes_per_token: float
    gpu_bytes_per_token_one_group: float
    derivation: FrozenDict = field(repr=False, compare=False)

    @property
    def naive_tokens(self) -> int:
        """What dividing ``cpu_bytes_to_use`` by one rank's GPU bytes per token
        of one group would promise (the common over-estimate)."""
        if not self.gpu_bytes_per_token_one_group:
            return 0
        return int(self.cpu_bytes_to_use // self.gpu_bytes_per_token_one_group)

    def explain(self) -> str:
        """Each number with the rule and the inputs behind it, one line each."""
        return "\n".join(f"{k}: {v}" for k, v in self.derivation.items())

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "derivation"}
        out["group_tokens_per_chunk"] = list(self.group_tokens_per_chunk)
        out["naive_tokens"] = self.naive_tokens
        out["derivation"] = dict(self.derivation)
        return out


def host_sizing(
    result: OffloadResult, cpu_bytes_to_use: int, *, alignment: int = HOST_PAGE_ALIGNMENT
) -> HostSizing:
    """Host bytes per block and per token, and the tokens ``cpu_bytes_to_use``
    holds, as vLLM's ``CPUOffloadingSpec.__init__`` sizes its region.

    ``result`` is :func:`kvexplore.offload_config`'s answer; ``alignment`` is
    the host page size the region rounds chunks to (``mmap.PAGESIZE``).
    """
    _check_result(result)
    check_int("cpu_bytes_to_use", cpu_bytes_to_use)
    check_int("alignment", alignment)
    c = result.config
    world = c.parallel.world_size
    bpc = c.cache.blocks_per_chunk
    per_block = c.worker_kv_bytes_per_block
    if per_block <= 0:
        raise KVExploreError(
            f"worker_kv_bytes_per_block={per_block}, world_size={world}, "
            f"{len(c.groups)} groups: nothing to offload; expected a plan with KV cache groups"
        )
    if bpc <= 0:
        raise KVExploreError(
            f"blocks_per_chunk={bpc} (from extra_config {dict(c.extra_config)!r}): a chunk "
            f"must hold at least one block; {release_name()}'s OffloadingConfig accepts this, "
            "but CPUOffloadingSpec cannot size a host region from it; expected an "
            "extra_config 'block_size' of at least one GPU block"
        )
    # CPUOffloadingSpec: replicated_layout counts only with the shared mmap
    # region, which the CUDA platform kvexplore answers for uses.
    num_copies = 1 if c.replicated_layout else world
    raw_chunk = per_block * num_copies * bpc
    aligned = cdiv(raw_chunk, alignment) * alignment
    num_chunks = cpu_bytes_to_use // aligned
    tpc = tuple(g.tokens_per_block * bpc for g in c.groups)
    span = math.lcm(*tpc)
    chunks_per_span = sum(span // t for t in tpc)
    p = result.plan
    h = HostSizing(
        cpu_bytes_to_use=cpu_bytes_to_use,
        world_size=world,
        num_copies=num_copies,
        replicated_layout=bool(c.replicated_layout),
        blocks_per_chunk=bpc,
        worker_kv_bytes_per_block=per_block,
        kv_bytes_per_chunk=raw_chunk,
        alignment=alignment,
        aligned_kv_bytes_per_chunk=aligned,
        num_chunks=num_chunks,
        group_tokens_per_chunk=tpc,
        span_tokens=span,
        chunks_per_span=chunks_per_span,
        tokens=(num_chunks // chunks_per_span) * span,
        host_bytes_per_block=aligned / bpc,
        host_bytes_per_token=aligned * chunks_per_span / span,
        gpu_bytes_per_token_one_group=p.bytes_per_block / p.block_size if p.block_size else 0.0,
        derivation=FrozenDict(),
    )
    return dataclasses.replace(h, derivation=FrozenDict(_host_reasons(h, p.bytes_per_block, p.block_size)))


def _host_reasons(h: HostSizing, gpu_block_bytes: int, block_size: int) -> dict[str, str]:
    """:attr:`HostSizing.derivation`: each number's rule with its inputs."""
    bpc, aligned, span = h.blocks_per_chunk, h.aligned_kv_bytes_per_chunk, h.span_tokens
    tpc, chunks = h.group_tokens_per_chunk, h.chunks_per_span
    gpu_per_token = h.gpu_bytes_per_token_one_group
    return {
        "num_copies": (
            f"{h.num_copies}: replicated_layout={h.replicated_layout} "
            + ("(one copy for all ranks in the shared mmap region)" if h.replicated_layout
               else f"-> one copy per worker, world_size {h.world_size}")
        ),
        "kv_bytes_per_chunk": (
            f"{h.kv_bytes_per_chunk:,} = worker_kv_bytes_per_block {h.worker_kv_bytes_per_block:,} "
            f"x {h.num_copies} copies x blocks_per_chunk {bpc}"
        ),
        "aligned_kv_bytes_per_chunk": (
            f"{aligned:,} = round_up({h.kv_bytes_per_chunk:,}, {h.alignment}) "
            "(SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE)"
        ),
        "num_chunks": f"{h.num_chunks:,} = cpu_bytes_to_use {h.cpu_bytes_to_use:,} // {aligned:,}",
        "chunks_per_span": (
            f"{chunks}: a chunk holds one group's blocks (offload key = "
            f"(block hash, group)); {len(tpc)} groups with "
            f"{', '.join(map(str, tpc))} tokens per chunk -> {chunks} chunks "
            f"per {span:,}-token span"
        ),
        "tokens": f"{h.tokens:,} = {h.num_chunks:,} // {chunks} spans x {span:,} tokens",
        "host_bytes_per_block": (
            f"{h.host_bytes_per_block:,.1f} = aligned chunk {aligned:,} / {bpc} blocks "
            f"(all {h.num_copies} copies of one group's block)"
        ),
        "host_bytes_per_token": (
            f"{h.host_bytes_per_token:,.1f} = {aligned:,} x {chunks} chunks / {span:,} tokens"
        ),
        "not_gpu_bytes_per_token": (
            f"one rank's GPU block {gpu_block_bytes:,} B / {block_size} tokens = "
            f"{gpu_per_token:,.1f} B per token would promise {h.naive_tokens:,} tokens; "
            f"host tokens are {h.tokens:,}"
        ),
    }


@dataclass(frozen=True, kw_only=True)
class ChunkSizes(Displayable):
    """The LMCache ``chunk_size`` values a plan accepts: multiples of the
    hybrid block (``resolve_kv_cache_block_sizes``: the lcm of every group's
    DCP-resolved block size), as LMCache stores whole vLLM blocks of every
    group.  ``valid``: the first multiples; ``checked``: asked size -> valid.
    """

    hybrid_block_size: int
    group_block_sizes: tuple[int, ...]
    valid: tuple[int, ...]
    checked: FrozenDict
    rule: str

    def is_valid(self, chunk_size: int) -> bool:
        check_int("chunk_size", chunk_size)
        return chunk_size % self.hybrid_block_size == 0

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [{"chunk_size": k, "valid": v} for k, v in self.checked.items()]
        )

    def explain(self) -> str:
        return self.rule

    def to_dict(self) -> dict:
        return {
            "hybrid_block_size": self.hybrid_block_size,
            "group_block_sizes": list(self.group_block_sizes),
            "valid": list(self.valid),
            "checked": {str(k): v for k, v in self.checked.items()},
            "rule": self.rule,
        }


def lmcache_chunk_sizes(
    result: OffloadResult, *, check: Sequence[int] = (256,), count: int = 8
) -> ChunkSizes:
    """The LMCache chunk sizes valid for ``result``'s plan (model, TP, DCP,
    dtypes): multiples of the hybrid block, the first ``count`` of them, and a
    verdict on each size in ``check`` (LMCache's default is 256)."""
    _check_result(result)
    check_int("count", count)
    for size in check:
        check_int("chunk_size", size)
    sizes = tuple(g.tokens_per_block for g in result.config.groups)
    hybrid = math.lcm(*sizes)
    p = result.plan
    checked = {s: s % hybrid == 0 for s in check}
    rule = (
        f"chunk_size % {hybrid} == 0: LMCache moves whole vLLM blocks of every group; "
        f"the groups' DCP-resolved block sizes {list(sizes)} "
        f"(TP {p.tensor_parallel_size}, DCP "
        f"{p.decode_context_parallel_size}, kv_cache_dtype "
        f"{p.kv_cache_dtype}) have lcm {hybrid}"
        + "".join(f"; {s}: {'valid' if ok else 'invalid'}" for s, ok in checked.items())
    )
    return ChunkSizes(
        hybrid_block_size=hybrid,
        group_block_sizes=sizes,
        valid=tuple(hybrid * k for k in range(1, count + 1)),
        checked=FrozenDict(checked),
        rule=rule,
    )


__all__ = ["HOST_PAGE_ALIGNMENT", "ChunkSizes", "HostSizing", "host_sizing", "lmcache_chunk_sizes"]
