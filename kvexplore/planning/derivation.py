"""Why a plan has the sizes it has: one line per size or GPU-dependent decision.

:func:`plan_derivation` reads a plan's frozen facts (and what the build
recorded of vLLM's ``_align_hybrid_block_size`` inputs) and states each rule
with its numbers, in the terms of vLLM's own code:

* ``block_size`` of a hybrid model, as ``vllm/platforms/interface.py:
  _align_hybrid_block_size`` computes it: ``k = max(smallest kernel block of
  the backend, block size after the backends' preference)``; for an MLA model
  ``k = max(k, 128)``; in ``align`` mode ``k = lcm(k, prefill checkpoint
  alignment)``; then ``k x cdiv(mamba page, k x attention bytes per token)``,
  rounded up to a multiple of every backend's smallest kernel block.
  Qwen3.5-0.8B on an A100: ``544 = 16 x cdiv(1085440, 16 x 2048)``.
* the attention backend, the GDN prefill kernel, the checkpoint alignment,
  the Mamba page padding, the attention page per token, each group's kernel
  block, the Mamba state slots a drafter adds, vLLM's admission verdict.
"""

from __future__ import annotations

import math
from typing import Any

from kvexplore.layout import cdiv

_PREFILL_KERNELS = {"flashinfer": "FlashInfer", "triton": "Triton/FLA", "cutedsl": "CuteDSL"}

#: The block multiple vLLM imposes on MLA + Mamba hybrids
#: (``_align_hybrid_block_size``: TRTLLM / FlashInfer MLA decode kernels).
MLA_HYBRID_BLOCK_MULTIPLE = 128


def smallest_kernel_block(backend) -> int:
    """The smallest kernel block a backend supports (``MultipleOf(n)`` counts
    as ``n``; no declared sizes as 1), as ``_align_hybrid_block_size`` reads it."""
    from vllm.v1.attention.backend import MultipleOf

    sizes = backend.get_supported_kernel_block_sizes()
    return min((s.base if isinstance(s, MultipleOf) else s) for s in sizes) if sizes else 1


def _backend_line(p) -> str:
    names = sorted({p.layer_backends[n].get_name() for n in p.layer_backends
                    if n in p.layer_specs and hasattr(p.layer_specs[n], "num_kv_heads")})
    requested = p.request.attention_backend
    cap = p.gpu.compute_capability
    how = (f"--attention-backend {requested}, validated for SM {cap}" if requested else
           f"vLLM's first valid backend for SM {cap} "
           "(CudaPlatformBase.get_attn_backend_cls priority order)")
    return f"{', '.join(names) or p.attention_backend}: {how}"


def _gdn_line(p, gdn: str) -> str:
    rule = "SM 9.0, or SM 10.x/12.x with linear_key_head_dim 128 and CUDA >= 13"
    if gdn != "flashinfer":
        rule = f"FlashInfer's GDN prefill needs {rule}"
    return (f"{_PREFILL_KERNELS.get(gdn, gdn)} on {p.gpu.name} ({rule}; "
            "qwen_gdn_linear_attn.py: _resolve_gdn_prefill_backend)")


def _mode_line(p) -> str:
    asked = p.request.mamba_cache_mode
    caching = "on" if p.enable_prefix_caching else "off"
    if asked is None:
        return (f"{p.mamba_cache_mode!r}: vLLM's default for this model with prefix caching "
                f"{caching} (models/config.py: MambaModelConfig)")
    if asked != p.mamba_cache_mode:
        return (f"{p.mamba_cache_mode!r}, not the requested {asked!r}: vLLM sets it with "
                f"prefix caching {caching} (models/config.py: MambaModelConfig)")
    return f"{p.mamba_cache_mode!r}: as requested"


def _checkpoint_line(p, checkpoint) -> str:
    if p.mamba_cache_mode != "align":
        return (f"not used: mamba_cache_mode={p.mamba_cache_mode!r} "
                "(only 'align' aligns blocks to it)")
    if checkpoint:
        return f"{checkpoint}: lcm of every Mamba layer's get_prefill_checkpoint_alignment"
    return "none: not every Mamba layer exports prefill checkpoints"


def hybrid_block_terms(p) -> dict[str, Any] | None:
    """The terms of ``_align_hybrid_block_size`` for a hybrid plan, or None
    when vLLM did not align (attention-only or attention-free)."""
    d = p.decisions
    backend = d.get("alignment_backend")
    if backend is None or p.mamba_page_size is None or not p.attention_page_bytes_per_token:
        return None
    kernel = max(smallest_kernel_block(backend), int(d["pre_alignment_block_size"]))
    mla = max(kernel, MLA_HYBRID_BLOCK_MULTIPLE) if p.use_mla else kernel
    checkpoint = d.get("prefill_checkpoint_alignment") if p.mamba_cache_mode == "align" else None
    align = math.lcm(mla, checkpoint) if checkpoint else mla
    raw = align * cdiv(p.mamba_page_size, align * p.attention_page_bytes_per_token)
    multiple = math.lcm(*(smallest_kernel_block(b) for b in d.get("alignment_backends", ())), 1)
    return {"kernel": kernel, "mla": mla, "checkpoint": checkpoint, "align": align, "raw": raw,
            "multiple": multiple, "block": multiple * cdiv(raw, multiple)}


def _hybrid_block_line(p, t: dict[str, Any]) -> str:
    bs, attn, gdn = p.block_size, p.attention_page_bytes_per_token, p.decisions.get("gdn_prefill_backend")
    head = f"lcm({t['mla']}, {t['checkpoint']})" if t["align"] != t["mla"] else f"{t['align']}"
    formula = f"{head} x cdiv({p.mamba_page_size}, {t['align']} x {attn})"
    if t["block"] != t["raw"]:
        formula += f" = {t['raw']}, rounded up to a multiple of {t['multiple']}"
    why = ""
    if t["mla"] != t["kernel"]:
        why = (f"  (MLA + Mamba: max({t['kernel']}, {MLA_HYBRID_BLOCK_MULTIPLE}), blocks are "
               f"multiples of {MLA_HYBRID_BLOCK_MULTIPLE} for the MLA decode kernels)")
    elif t["kernel"] > smallest_kernel_block(p.decisions["alignment_backend"]):
        why = (f"  ({t['kernel']}: the block size before alignment, vLLM "
               f"{p.vllm_version}'s CacheConfig.DEFAULT_BLOCK_SIZE or --block-size)")
    elif gdn is not None and p.mamba_cache_mode == "align":
        c = t["checkpoint"]
        why = (f"  ({p.gpu.name}: {_PREFILL_KERNELS.get(gdn, gdn)} GDN prefill -> "
               + (f"{c}-token checkpoints)" if c and c > 1 else "no checkpoint alignment)"))
    if t["block"] == bs:
        return f"{bs} = {formula}{why}"
    return (f"{bs} (vLLM's update_block_size_for_backend; _align_hybrid_block_size gives "
            f"{formula} = {t['block']})")


def _block_line(p) -> str:
    bs = p.block_size
    terms = hybrid_block_terms(p)
    if terms is not None:
        return _hybrid_block_line(p, terms)
    if p.backend is None:
        return f"{bs} (attention-free: the Mamba block is the scheduler block)"
    if p.request.block_size is not None:
        return f"{bs} (--block-size {bs})"
    return (f"{bs} ({p.attention_backend}'s preferred block size on {p.gpu.name}, "
            "Platform.update_block_size_for_backend)")


def _padding_line(p) -> str:
    padded, mamba = p.mamba_page_size_padded, p.mamba_page_size
    if not padded:
        return f"none: attention page == Mamba page ({mamba})"
    return (f"{padded} = {p.block_size} x {p.attention_page_bytes_per_token} (Mamba page "
            f"{mamba} padded by {100 * (padded - mamba) / mamba:.2f}%)")


def _attention_page_line(p) -> str:
    a, h = p.attention_page_bytes_per_token, p.head_size
    if p.use_mla:
        return f"{a} = 1 latent x {h} x {a // max(1, h)} B (MLA)"
    heads = p.num_kv_heads
    return (f"{a} = 2 (K,V) x {heads} KV heads/rank x {h} x "
            f"{a // max(1, 2 * heads * h)} B "
            f"(max(1, {p.total_num_kv_heads} // TP {p.tensor_parallel_size}) heads)")


def _kernel_line(p, g) -> str:
    backend = p.layer_backends.get(g.layer_names[0])
    sizes = ", ".join(map(str, backend.get_supported_kernel_block_sizes())) if backend else "?"
    name = backend.get_name() if backend else "?"
    kb, block = g.kernel_block_size, g.kv_cache_spec.block_size
    if kb != block:
        return (f"{kb}: largest of {name}'s kernel sizes on {p.gpu.name} [{sizes}] dividing "
                f"{block} ({block // kb} kernel pages per block)")
    return (f"{kb}: {name} accepts [{sizes}] on {p.gpu.name}, so the "
            f"{kb}-token block runs unsplit (1 kernel page per block)")


def _drafter_line(p, bare) -> str:
    d = p.drafter
    out = d.summary()
    draft = [g.index for g in p.groups if any(n in d.layer_names for n in g.layer_names)]
    if draft:
        out += f"; in group(s) {draft}"
    if bare is None:
        return out
    changes = []
    for what, before, after in (
        ("KV cache groups (layers each)", [len(g.layer_names) for g in bare.groups],
         [len(g.layer_names) for g in p.groups]),
        ("block_size", bare.block_size, p.block_size),
        ("mamba_page_size_padded", bare.mamba_page_size_padded, p.mamba_page_size_padded),
        ("bytes_per_block", bare.bytes_per_block, p.bytes_per_block),
        ("blocks one request pins", sum(bare.blocks_per_request), sum(p.blocks_per_request)),
    ):
        if before != after:
            changes.append(f"{what} {before} -> {after}")
    return out + "; against no drafter: " + ("; ".join(changes) or "nothing changes")


def plan_derivation(p, bare=None) -> dict[str, str]:
    """Every size and GPU-dependent decision of plan ``p``, by name; ``bare``
    is the same plan without its ``speculative_config`` (what the drafter
    changes is stated against it)."""
    gpu = p.gpu
    out = {"vllm": (f"vLLM {p.vllm_version}, the installed release: every number below is "
                    "its own code's answer"),
           "gpu": (f"{gpu.name}: {gpu.device_name}, compute capability "
                   f"{gpu.compute_capability}, CUDA runtime {gpu.cuda_runtime_major} "
                   "(emulated for vLLM's platform)")}
    if p.backend is not None:
        out["attention_backend"] = _backend_line(p)
    gdn = p.decisions.get("gdn_prefill_backend")
    if gdn is not None:
        out["gdn_prefill_backend"] = _gdn_line(p, gdn)
    if p.mamba_page_size is not None:
        out["mamba_cache_mode"] = _mode_line(p)
        out["prefill_checkpoint_alignment"] = _checkpoint_line(
            p, p.decisions.get("prefill_checkpoint_alignment"))
    out["block_size"] = _block_line(p)
    if p.mamba_page_size is not None and p.attention_page_bytes_per_token is not None:
        out["mamba_page_size_padded"] = _padding_line(p)
    if p.attention_page_bytes_per_token is not None:
        out["attention_page_bytes_per_token"] = _attention_page_line(p)
    for g in p.groups:
        if g.layer_names and hasattr(g.spec, "num_kv_heads"):
            out[f"kernel_block_size[{g.index}]"] = _kernel_line(p, g)
    if p.drafter is not None:
        out["drafter"] = _drafter_line(p, bare)
        if p.mamba_page_size is not None:
            n = p.drafter.num_speculative_tokens
            out["num_speculative_blocks"] = (
                f"{n}: Mamba state slots for {n} draft tokens ({p.drafter.method}, "
                "MambaSpec.num_speculative_blocks)"
            )
    out["num_blocks"] = _num_blocks_line(p)
    if p.admission is not None:
        out["admission"] = p.admission.summary()
    return out


def _num_blocks_line(p) -> str:
    given = p.request
    if given.num_blocks is not None:
        return f"{p.num_blocks:,}: given (num_gpu_blocks_override)"
    per_block = f"{p.bytes_per_block:,} B" if p.bytes_per_block else "the bytes"
    how = ("what the extensible KV cache measures after warmup (measure_kv_cache_bytes)"
           if p.extensible_kv_cache else "vLLM's start-up memory profile")
    source = ("given (kv_cache_memory_bytes)" if given.kv_cache_memory_bytes is not None else
              f"the low end of {how} on the {p.gpu.name} at gpu_memory_utilization "
              f"{p.gpu_memory_utilization:g} (capacity() itemises it)")
    if p.pipeline_parallel_size > 1:
        own = p.kv_cache_memory_bytes // p.bytes_per_block if p.bytes_per_block else 0
        return (f"{p.num_blocks:,} = the fewest of the {p.pipeline_parallel_size} pipeline "
                "stages' workers, each its KV cache memory // its bytes per block id "
                f"(get_kv_cache_configs); stage {p.pipeline_parallel_rank}: "
                f"{p.kv_cache_memory_bytes:,} B // {per_block} per block id = {own:,}; "
                f"KV cache memory: {source}")
    return (f"{p.num_blocks:,} = {p.kv_cache_memory_bytes:,} B // {per_block} per block id "
            f"(get_kv_cache_configs); KV cache memory: {source}")


__all__ = ["MLA_HYBRID_BLOCK_MULTIPLE", "hybrid_block_terms", "plan_derivation",
           "smallest_kernel_block"]
