"""One record per figure a vLLM start-up log states.

Each :class:`Figure` says what the figure is (``name``, ``kind``,
``description``, ``unit``), where the structured lines give it (its key in
the engine banner and in the API server's ``non-default args``), whether it
is a ``plan()`` keyword of the same name, and, for the figures
:func:`kvexplore.check_log` compares, the memory term or step it belongs to
(``term``), vLLM's rule for it (``rule``) and how kvexplore's
:class:`~kvexplore.capacity_planning.CapacityReport` answers it (``answer``;
``answer_range`` where kvexplore's answer is a range).  Every list the
reading, checking and calibrating modules use is derived from
:data:`RECORDS`; the memory terms a calibration carries are the figures of
the same names (:data:`kvexplore.capacity_planning.CALIBRATED_TERMS`).

How a figure is read from a line (the line's pattern and the words that name
it) is :data:`kvexplore.logs.reading.RULES`: one line rule can state several
figures and one figure can be stated by several lines.

This module needs neither vLLM nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The kinds of figure, in the order tables list them.
KINDS = ("deployment", "memory", "layout", "capacity")


@dataclass(frozen=True)
class Figure:
    """One figure a start-up log can state.

    ``unit`` is one of ``bytes``, ``tokens``, ``blocks``, ``fraction``,
    ``percent``, ``x`` (requests), ``count``, ``name``, ``flag``, ``config``.
    ``banner_key`` / ``arg_key``: the figure's key in the engine banner's
    config and in ``non-default args`` (None when those lines do not carry
    it).  ``plan_keyword``: the figure is the ``plan()`` keyword of the same
    name.  ``term`` and ``rule`` (both or neither): the figure is compared by
    :func:`kvexplore.check_log`; ``answer`` takes a ``CapacityReport`` and
    gives kvexplore's value (None where the report has none), and
    ``answer_range`` gives ``(low, high)`` where kvexplore's answer is a
    range the log's value must fall in."""

    name: str
    kind: str
    description: str
    unit: str
    banner_key: str | None = None
    arg_key: str | None = None
    plan_keyword: bool = False
    term: str | None = None
    rule: str | None = None
    answer: Callable[[Any], Any] | None = None
    answer_range: Callable[[Any], tuple[int, int]] | None = None

    @property
    def checked(self) -> bool:
        """Whether :func:`kvexplore.check_log` compares this figure."""
        return self.rule is not None

    @property
    def needs_memory(self) -> bool:
        """Whether kvexplore's answer needs its own memory estimate (a memory
        or capacity figure): not answered when that estimate refuses the
        deployment."""
        return self.checked and self.kind in ("memory", "capacity")

    @property
    def memory_dependent(self) -> bool:
        """Whether kvexplore's answer follows from the KV cache memory (a
        capacity figure), so it is also answered at the log's own KV memory."""
        return self.checked and self.kind == "capacity"

    @property
    def floored(self) -> bool:
        """Whether the figure is a whole count the KV memory floors (tokens,
        blocks): one more or fewer is within the memory's printed precision."""
        return self.unit in ("tokens", "blocks")


def _setting(name: str, description: str, unit: str, *, banner_key: str | None = "",
             arg_key: str | None = "", plan_keyword: bool = True, **check) -> Figure:
    """A deployment figure that the banner and ``non-default args`` carry
    under its own name unless told otherwise ("" = the name, None = not
    carried)."""
    return Figure(
        name, "deployment", description, unit,
        banner_key=name if banner_key == "" else banner_key,
        arg_key=name if arg_key == "" else arg_key,
        plan_keyword=plan_keyword, **check,
    )


def _memory_range(r) -> tuple[int, int]:
    return r.kv_cache_memory_range


def _total_range(r) -> tuple[int, int]:
    return r.plan.gpu.total_memory_range


def _padding_percent(r) -> float | None:
    p = r.plan
    if not (p.mamba_page_size and p.mamba_page_size_padded):
        return None
    return round((p.mamba_page_size_padded - p.mamba_page_size) / p.mamba_page_size * 100, 2)


def _equivalent_utilization(r) -> float | None:
    if not r.total_memory_bytes:
        return None
    return round(r.gpu_memory_utilization - r.cudagraph_bytes / r.total_memory_bytes, 4)


#: Every figure, in table order (deployment, memory, layout, capacity).
RECORDS: tuple[Figure, ...] = (
    _setting("vllm_version", "the vLLM release that printed the log", "name",
             banner_key=None, arg_key=None, plan_keyword=False),
    _setting("engine", "V1 or V0 engine", "name", banner_key=None, arg_key=None,
             plan_keyword=False),
    _setting("model", "the model served", "name", plan_keyword=False),
    _setting("dtype", "the model's dtype", "name"),
    _setting("quantization", "the checkpoint's quantization method", "name"),
    _setting("tensor_parallel_size", "TP", "count"),
    _setting("pipeline_parallel_size", "PP", "count"),
    _setting("data_parallel_size", "DP", "count"),
    _setting("decode_context_parallel_size", "DCP", "count"),
    _setting("enable_expert_parallel", "EP", "flag"),
    _setting("max_model_len", "max_model_len (the banner's max_seq_len)", "tokens",
             banner_key="max_seq_len", term="input", rule="planned as the log states it",
             answer=lambda r: r.max_model_len),
    _setting("block_size", "--block-size as requested", "tokens"),
    _setting("kv_cache_dtype", "KV cache dtype", "name"),
    _setting("enable_prefix_caching", "prefix caching", "flag"),
    _setting("enforce_eager", "enforce_eager (no CUDA graphs)", "flag", plan_keyword=False),
    _setting("gpu_memory_utilization", "gpu_memory_utilization", "fraction",
             term="input", rule="planned as the log states it",
             answer=lambda r: r.gpu_memory_utilization),
    _setting("speculative_config", "the speculative decoding config", "config"),
    _setting("max_num_batched_tokens", "max_num_batched_tokens", "tokens"),
    _setting("max_num_seqs", "max_num_seqs", "count"),
    _setting("gpu_name", "the card's name", "name", banner_key=None, arg_key=None,
             plan_keyword=False),
    Figure("total_memory_bytes", "memory", "the card's total memory (torch.cuda.mem_get_info)",
           "bytes", term="total",
           rule="torch.cuda.mem_get_info() total of the card; kvexplore: its reading in "
                "kvexplore.gpus()",
           answer=lambda r: r.total_memory_bytes, answer_range=_total_range),
    Figure("requested_memory_bytes", "memory", "total x gpu_memory_utilization", "bytes",
           term="total",
           rule="ceil(total x gpu_memory_utilization) (worker/utils.py: request_memory)",
           answer=lambda r: r.requested_memory_bytes),
    Figure("weight_bytes", "memory", "the loaded weights per rank", "bytes", term="weights",
           rule="torch memory the loaded model holds (gpu_model_runner.load_model); kvexplore: "
                "parameters and buffers of vLLM's model built on the meta device, per rank",
           answer=lambda r: r.weight_bytes),
    Figure("activation_peak_bytes", "memory", "the profile run's activation peak", "bytes",
           term="activation peak",
           rule="peak of profile_run (dummy forward of max_num_batched_tokens, then the "
                "sampler); kvexplore: the forward traced on meta tensors",
           answer=lambda r: r.activation_peak_bytes),
    Figure("peak_torch_bytes", "memory", "V0: the profile run's torch peak, weights included",
           "bytes"),
    Figure("non_torch_bytes", "memory", "non-torch memory (cuBLAS, NCCL)", "bytes",
           term="non-torch",
           rule="memory_profiling's non-torch increase (cuBLAS, NCCL); kvexplore: a range "
                "from public logs",
           answer=lambda r: r.non_torch_bytes),
    Figure("cudagraph_bytes", "memory", "the CUDA-graph memory estimate", "bytes",
           term="CUDA graphs",
           rule="profile_cudagraph_memory; kvexplore: a range per captured size",
           answer=lambda r: r.cudagraph_bytes),
    Figure("cudagraph_capture_bytes", "memory", "what capturing the CUDA graphs took", "bytes"),
    Figure("kv_cache_memory_bytes", "memory", "the KV cache memory per rank", "bytes",
           term="memory",
           rule="determine_available_memory: requested - weights - activation peak - "
                "non-torch - CUDA graphs",
           answer=lambda r: r.kv_cache_memory, answer_range=_memory_range),
    Figure("equivalent_utilization", "memory", "the utilization without CUDA-graph profiling",
           "fraction", term="CUDA graphs",
           rule="round(gpu_memory_utilization - CUDA graphs / total, 4) (gpu_worker.py)",
           answer=_equivalent_utilization),
    Figure("suggested_utilization", "memory", "the utilization that keeps the older KV size",
           "fraction"),
    Figure("attention_block_size", "layout", "the hybrid-aligned attention block size", "tokens",
           term="block alignment",
           rule="update_block_size_for_backend / _align_hybrid_block_size: the kernel "
                "alignment x cdiv(Mamba page, alignment x attention bytes per token)",
           answer=lambda r: r.plan.block_size),
    Figure("mamba_padding_percent", "layout", "the Mamba page's padding, percent", "percent",
           term="padding",
           rule="the Mamba page padded to the attention page: (padded - page) / page",
           answer=_padding_percent),
    Figure("kv_cache_group_block_sizes", "layout", "one block size per KV cache group", "tokens",
           term="group count",
           rule="get_kv_cache_groups: one group per spec kind and layer count "
                "(resolve_kv_cache_block_sizes)",
           answer=lambda r: tuple(int(g.kv_cache_spec.block_size) for g in r.plan.groups)),
    Figure("kv_lcm_block_size", "layout", "the scheduler's lcm block size", "tokens",
           term="group count",
           rule="the scheduler block: lcm of the groups' block sizes "
                "(resolve_kv_cache_block_sizes)",
           answer=lambda r: r.scheduler_block_size),
    Figure("attention_backend", "layout", "the attention backend", "name", term="backend",
           rule="the platform's get_attn_backend_cls for the GPU",
           answer=lambda r: r.plan.attention_backend),
    Figure("kv_cache_layout", "layout", "the KV cache layout", "name", term="layout",
           rule="resolve_kv_cache_layout over the model's backends",
           answer=lambda r: r.plan.kv_cache_layout_name or None),
    Figure("padding_layers", "layout", "padding layers added to equalise group sizes", "count"),
    Figure("padding_layers_waste_percent", "layout", "KV memory the padding layers may waste",
           "percent"),
    Figure("kv_cache_size_tokens", "capacity", "GPU KV cache size, tokens", "tokens",
           term="admission",
           rule="get_kv_cache_capacity: int(max_concurrency x max_model_len), Mamba blocks "
                "counted",
           answer=lambda r: r.kv_cache_size_tokens),
    Figure("max_concurrency", "capacity", "requests of max_model_len the cache holds", "x",
           term="admission",
           rule="get_max_concurrency_for_kv_cache_config: num_blocks / blocks one request pins",
           answer=lambda r: round(r.max_concurrency, 2)),
    Figure("num_gpu_blocks", "capacity", "KV cache blocks", "blocks", term="admission",
           rule="get_kv_cache_configs: KV memory // bytes of one block id in the pool",
           answer=lambda r: r.num_blocks),
    Figure("estimated_max_model_len", "capacity", "the longest length the memory admits",
           "tokens", term="admission",
           rule="_estimate_max_model_len_from_groups on the memory less the null block",
           answer=lambda r: r.largest_max_model_len),
    Figure("needed_kv_cache_bytes", "capacity", "KV memory one request of max_model_len needs",
           "bytes"),
)

#: The records by name.
BY_NAME: dict[str, Figure] = {f.name: f for f in RECORDS}

#: What each figure is, by name: (kind, description).
FIGURES: dict[str, tuple[str, str]] = {f.name: (f.kind, f.description) for f in RECORDS}

#: The deployment a log implies: the figures ``VllmLog.deployment`` lists.
DEPLOYMENT = tuple(f.name for f in RECORDS if f.kind == "deployment")

#: Log figures that are ``plan()`` keywords of the same name.
PLAN_FIGURES = tuple(f.name for f in RECORDS if f.plan_keyword)

#: The engine banner's config keys and the figure each gives.
BANNER_KEYS = {f.banner_key: f.name for f in RECORDS if f.banner_key}

#: ``non-default args`` keys and the figure each gives.
ARG_KEYS = {f.arg_key: f.name for f in RECORDS if f.arg_key}

#: The figures :func:`kvexplore.check_log` compares, in the order its table
#: lists them: the memory terms, the layout, the capacity the memory gives,
#: then the deployment's inputs.
CHECKED = tuple(sorted((f for f in RECORDS if f.checked),
                       key=lambda f: ("memory", "layout", "capacity", "deployment").index(f.kind)))


def answers(report) -> dict[str, Any]:
    """kvexplore's value of every compared figure from a ``CapacityReport``
    (a figure the report has no value for is left out)."""
    out = {f.name: f.answer(report) for f in CHECKED}
    return {name: value for name, value in out.items() if value is not None}


__all__ = [
    "ARG_KEYS",
    "BANNER_KEYS",
    "BY_NAME",
    "CHECKED",
    "DEPLOYMENT",
    "FIGURES",
    "KINDS",
    "PLAN_FIGURES",
    "RECORDS",
    "Figure",
    "answers",
]
