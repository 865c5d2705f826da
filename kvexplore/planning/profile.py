"""vLLM's memory profile of a build, estimated offline on the meta device.

``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``) gives
the KV cache ``requested - weights - peak activation - non-torch memory -
CUDA graphs``, each read from the GPU at start-up.  :func:`profile_build`
estimates each term from the model vLLM builds on the meta device:

* **weights**: the parameters and buffers the built model holds (quantized
  layouts as vLLM creates them), plus what a drafter adds; exact.
* **peak activation**: ``profile_run`` runs a dummy forward of
  ``max_num_batched_tokens`` tokens, then the sampler over ``max_num_seqs``
  rows.  The forward is run here on meta tensors under a dispatch-level
  tracker of live bytes, every vLLM custom op on its PyTorch-native path
  (attention and state kernels that write their output in place are
  skipped; their workspaces are not counted); the logits are the model's own
  ``compute_logits``; the sampler's float32 pipeline is 3 to 4 copies of the
  logits in float32 (the range's ends).  The peak is the larger phase.
* **non-torch memory** (cuBLAS workspaces, NCCL buffers at TP > 1) and the
  **CUDA-graph pool** (``profile_cudagraph_memory``, applied because
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1) depend on the
  GPU's libraries, not the model: ranges from public start-up logs (vLLM 0.19, H100:
  non-torch 0.13-0.27 GiB at TP 1, 2.06-2.17 GiB at TP >= 2; per capture mode
  8-260 MiB for the first graph and 6-8 MiB for each further one), times the
  capture sizes vLLM's config lists.

Every term is a ``(low, high)`` :class:`Term` with its source.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvexplore.layout import GiB, requested_memory
from kvexplore.planning.emulation import emulate, patch_attributes

MiB = 1 << 20
#: Non-torch memory at TP 1 and at TP >= 2 (bytes), from vLLM 0.19 logs on H100.
NON_TORCH = {1: (int(0.13 * GiB), int(0.27 * GiB)), 2: (int(2.06 * GiB), int(2.17 * GiB))}
#: One capture mode's first graph and each further graph (bytes), from vLLM 0.19 logs.
CUDAGRAPH_FIRST = (8 * MiB, 260 * MiB)
CUDAGRAPH_PER_GRAPH = (6 * MiB, 8 * MiB)
#: Float32 copies of the logits the sampler's warm-up pass holds at once.
SAMPLER_FP32_COPIES = (3, 4)


@dataclass(frozen=True)
class Term:
    """One memory term: bytes between ``low`` and ``high``, and where they come from."""

    low: int
    high: int
    source: str


@dataclass(frozen=True)
class MemoryProfile:
    """The terms of ``determine_available_memory`` for one build (bytes per rank)."""

    weights: Term
    activation_peak: Term
    non_torch: Term
    cudagraph: Term
    forward_peak_bytes: int
    logits_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    leaves_out: tuple[str, ...]


class LiveBytes(TorchDispatchMode):
    """Peak of the bytes held by the tensors ops create while the mode is on
    (each storage counted from its creation to its collection).  vLLM ops
    with no meta kernel that return nothing (they write their output in
    place) are skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.sizes: dict[int, int] = {}

    def _track(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.sizes:
            return
        self.sizes[key] = storage.nbytes()
        self.live += self.sizes[key]
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            out = func(*args, **(kwargs or {}))
        except NotImplementedError:
            if func.namespace == "vllm" and not func._schema.returns:
                return None
            raise
        for t in out if isinstance(out, (tuple, list)) else (out,):
            self._track(t)
        return out


def _native_ops(model) -> list:
    """Patch pairs: every vLLM ``CustomOp`` on its PyTorch-native forward, and
    no ``torch.compile`` (the forward is traced op by op)."""
    from vllm.model_executor.custom_op import CustomOp

    pairs = []
    for m in model.modules():
        if isinstance(m, CustomOp):
            pairs.append((m, "_forward_method", m.forward_native))
        if hasattr(m, "do_not_compile"):
            pairs.append((m, "do_not_compile", True))
    return pairs


def _traced_forward(built, tokens: int, seqs: int) -> tuple[int, int, str | None]:
    """``(forward peak, logits peak, why not traced)`` of the dummy run of
    ``built``'s pipeline stage: a stage after the first starts from the
    model's ``make_empty_intermediate_tensors`` (allocated inside the
    traced forward, as ``_dummy_run`` keeps them), and only the last stage
    computes logits (``profile_run`` samples on the last rank only)."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    from kvexplore.planning.worker import parallel_groups

    vc, model = built.vllm_config, built.model
    stages = int(vc.parallel_config.pipeline_parallel_size)
    first, last = built.pipeline_rank == 0, built.pipeline_rank == stages - 1
    ctx = vc.compilation_config.static_forward_context
    with contextlib.ExitStack() as stack:
        stack.enter_context(emulate(built.gpu))
        stack.enter_context(set_current_vllm_config(vc))
        stack.enter_context(parallel_groups(vc, built.pipeline_rank))
        stack.enter_context(patch_attributes(_native_ops(model)))
        ctx.update(built.forward_context)
        stack.callback(ctx.clear)
        try:
            ids = torch.zeros(tokens, dtype=torch.long, device="meta")
            positions = torch.arange(tokens, device="meta")
            forward, logits = LiveBytes(), LiveBytes()
            with set_forward_context(None, vc), torch.inference_mode():
                with forward:
                    stage = {} if first else {"intermediate_tensors":
                                              model.make_empty_intermediate_tensors(
                                                  batch_size=tokens, dtype=vc.model_config.dtype,
                                                  device="meta")}
                    hidden = model(input_ids=ids, positions=positions, **stage)
                if last:
                    with logits:
                        model.compute_logits(hidden[:seqs])
            return forward.peak, logits.peak, None
        except Exception as exc:  # a model whose forward cannot run on meta tensors
            return 0, 0, f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def _cudagraph(built) -> Term:
    """The CUDA-graph pool for the mode the runner resolves before
    ``profile_cudagraph_memory`` (:func:`kvexplore.planning.startup.profiled_cudagraph_mode`)."""
    from vllm.config.compilation import CUDAGraphMode

    from kvexplore.planning.startup import profiled_cudagraph_mode

    vc = built.vllm_config
    if vc.model_config.enforce_eager or vc.compilation_config.cudagraph_mode in (
            None, CUDAGraphMode.NONE):
        return Term(0, 0, "0: no CUDA graphs are captured (enforce_eager / cudagraph_mode NONE)")
    mode, sizes = profiled_cudagraph_mode(built)
    if mode in (None, CUDAGraphMode.NONE):
        return Term(0, 0, "0: the runner resolves cudagraph_mode to NONE for these backends "
                          "(resolve_cudagraph_mode_and_sizes)")
    modes = 2 if mode == CUDAGraphMode.FULL_AND_PIECEWISE else 1
    n = len(sizes)
    low, high = (modes * (first + max(n - 1, 0) * per) for first, per in
                 zip(CUDAGRAPH_FIRST, CUDAGRAPH_PER_GRAPH, strict=True))
    return Term(low, high, (
        f"ESTIMATE {low / GiB:.2f}-{high / GiB:.2f} GiB: {modes} capture mode(s) ({mode.name}) x "
        f"{n} capture sizes, 8-260 MiB for the first graph and 6-8 MiB per further graph "
        "(public vLLM 0.19 logs; vLLM measures it with profile_cudagraph_memory)"))


def _activation(built, forward: int, logits: int, why: str | None) -> Term:
    vc = built.vllm_config
    mc, sc = vc.model_config, vc.scheduler_config
    tokens, seqs = int(sc.max_num_batched_tokens), int(sc.max_num_seqs)
    traced = (f"forward of {tokens} tokens traced on meta tensors: {forward / GiB:.2f} GiB peak"
              if why is None else f"forward not traced ({why})")
    stages = int(vc.parallel_config.pipeline_parallel_size)
    if built.pipeline_rank < stages - 1:
        return Term(forward, forward, (
            f"ESTIMATE {forward / GiB:.2f} GiB: {traced}; no sampler on pipeline stage "
            f"{built.pipeline_rank} of {stages} (gpu_model_runner profile_run samples on the "
            "last rank only)"))
    vocab, hidden = mc.get_vocab_size(), mc.get_hidden_size()
    elem = mc.dtype.itemsize
    if not logits:
        logits = seqs * vocab * elem
    fp32 = seqs * vocab * 4
    kept = tokens * hidden * elem
    low = max(forward, logits + SAMPLER_FP32_COPIES[0] * fp32)
    high = max(forward, kept + logits + SAMPLER_FP32_COPIES[1] * fp32)
    return Term(low, high, (
        f"ESTIMATE {low / GiB:.2f}-{high / GiB:.2f} GiB = max(forward, sampler): {traced}; "
        f"sampler over {seqs} max_num_seqs x {vocab} vocab: logits {logits / GiB:.2f} GiB + "
        f"{SAMPLER_FP32_COPIES[0]}-{SAMPLER_FP32_COPIES[1]} float32 copies "
        "(gpu_model_runner profile_run: _dummy_run + _dummy_sampler_run)"))


def weight_term(built) -> Term:
    """What the loaded model holds per rank: the parameters and buffers of the
    model built on the meta device (a buffer shared by layers, such as a
    rotary cache, counted once), plus what a drafter adds; exact."""
    model = built.model
    target = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    draft = built.drafter.weight_bytes if built.drafter is not None else 0
    tp = built.vllm_config.parallel_config.tensor_parallel_size
    return Term(target + draft, target + draft, (
        f"{target + draft:,} B: parameters and buffers of vLLM's model built on the meta device "
        f"per rank at TP {tp}" + (f", {draft:,} B of them the drafter's" if draft else "")))


def profile_build(built) -> MemoryProfile:
    """The memory profile of a :class:`~kvexplore.planning.worker.BuiltModel`
    (see the module doc); the forward is traced once per build."""
    from kvexplore.memo import per_plan

    return per_plan(built, ("memory_profile",), lambda: _profile(built))


def _profile(built) -> MemoryProfile:
    vc = built.vllm_config
    sc, pc = vc.scheduler_config, vc.parallel_config
    tokens, seqs = int(sc.max_num_batched_tokens), int(sc.max_num_seqs)
    forward, logits, why = _traced_forward(built, tokens, seqs)
    weights = weight_term(built)
    low, high = NON_TORCH[1 if pc.tensor_parallel_size == 1 else 2]
    non_torch = Term(low, high, (
        f"ESTIMATE {low / GiB:.2f}-{high / GiB:.2f} GiB at TP {pc.tensor_parallel_size}: cuBLAS "
        "workspaces" + (", NCCL buffers" if pc.tensor_parallel_size > 1 else "")
        + " (memory_profiling: non_torch_increase; public vLLM 0.19 logs)"))
    leaves = ("attention and state kernel workspaces", "the drafter's dummy forward",
              "multimodal encoder profiling", "memory fragmentation")
    return MemoryProfile(weights, _activation(built, forward, logits, why), non_torch,
                         _cudagraph(built), forward, logits, tokens, seqs, leaves)


def memory_terms(built, gpu) -> dict[str, Term]:
    """Every term ``determine_available_memory`` starts from or subtracts, per
    rank, for ``built`` on ``gpu``: ``total_memory_bytes`` (what
    ``torch.cuda.mem_get_info()`` reports for the card, :func:`kvexplore.gpus`;
    the nominal size where no reading is known), then the build's
    ``weight_bytes``, ``activation_peak_bytes``, ``non_torch_bytes`` and
    ``cudagraph_bytes`` (:func:`profile_build`)."""
    low, high = gpu.total_memory_range
    if gpu.total_memory_gib is not None:
        total = Term(low, high, f"ESTIMATE {low:,}-{high:,} B: torch.cuda.mem_get_info() of the "
                                f"{gpu.device_name} ({gpu.total_memory_source})")
    else:
        total = Term(low, high, f"ESTIMATE {low:,} B: the card's nominal {gpu.memory_gib} GiB "
                                "(no mem_get_info reading known; pass total_memory_bytes)")
    mp = profile_build(built)
    return {"total_memory_bytes": total, "weight_bytes": mp.weights,
            "activation_peak_bytes": mp.activation_peak, "non_torch_bytes": mp.non_torch,
            "cudagraph_bytes": mp.cudagraph}


def kv_cache_memory_range(terms: dict[str, Term], gpu_memory_utilization: float,
                          *, extensible: bool = False, memory_in_use: int = 0) -> tuple[int, int]:
    """``(low, high)`` bytes the worker leaves the KV cache; the low end takes
    each subtracted term's high end and the total's low end, the high end the
    other way round.

    Sized by the profile (``determine_available_memory``):
    ``ceil(total x gpu_memory_utilization)`` minus every other term of
    :func:`memory_terms`.  With the extensible cache (``extensible``), the
    release sizes it after warmup from measured memory instead: its own
    ``measure_kv_cache_bytes`` on a card whose used memory is the weights,
    non-torch and CUDA-graph memory, with the activation peak as the transient
    peak it keeps free (plus its margin), and ``memory_in_use`` bytes held by
    another process since start (not free at start nor after warmup; the
    profile's sizing does not see them: it subtracts what the worker itself
    took)."""
    total = terms["total_memory_bytes"]
    rest = [t for name, t in terms.items() if name != "total_memory_bytes"]
    if not extensible:
        return (requested_memory(total.low, gpu_memory_utilization) - sum(t.high for t in rest),
                requested_memory(total.high, gpu_memory_utilization) - sum(t.low for t in rest))
    from kvexplore.planning.release import after_warmup_sizing

    measure = after_warmup_sizing()
    resident = [t for name, t in terms.items()
                if name not in ("total_memory_bytes", "activation_peak_bytes")]
    peak = terms["activation_peak_bytes"]

    def measured(card: int, used: int, transient: int) -> int:
        return int(measure(init_free_memory=card - memory_in_use,
                           free_memory=card - memory_in_use - used, committed_bytes=0,
                           requested_memory=requested_memory(card, gpu_memory_utilization),
                           transient_peak_bytes=transient))

    return (measured(total.low, sum(t.high for t in resident), peak.high),
            measured(total.high, sum(t.low for t in resident), peak.low))


__all__ = ["LiveBytes", "MemoryProfile", "Term", "kv_cache_memory_range", "memory_terms",
           "profile_build", "weight_term"]
