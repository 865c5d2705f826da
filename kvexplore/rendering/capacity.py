"""Text, HTML and figures of the capacity answers (:mod:`kvexplore.capacity_planning`,
:mod:`kvexplore.offloading.sizing`)."""

from __future__ import annotations

from collections.abc import Sequence

from kvexplore.errors import KVExploreError
from kvexplore.layout import GiB
from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html, pairs_html, pre_html, table_html
from kvexplore.rendering.layouts import plan_title


def capacity_text(r) -> str:
    """Headline, the summary table, the per-group table and the derivation."""
    p = r.plan
    head = (
        f"{p.model.name} on {p.gpu} TP {p.tensor_parallel_size}: "
        f"{r.num_blocks:,} blocks of {r.block_size} tokens, {r.kv_cache_size_tokens:,} tokens "
        f"(max concurrency {r.max_concurrency:.2f}x at {r.max_model_len:,})"
    )
    return "\n\n".join([head, r.summary.to_string(index=False), r.group_table.to_string(index=False),
                        r.explain()])


def capacity_html(r) -> str:
    parts = [
        pairs_html([
            ("model", r.plan.model.name), ("gpu", str(r.plan.gpu)),
            ("kv_cache_memory", f"{r.kv_cache_memory / GiB:.2f} GiB"),
            ("num_blocks", f"{r.num_blocks:,}"),
            ("GPU KV cache size", f"{r.kv_cache_size_tokens:,} tokens"),
            ("max concurrency", f"{r.max_concurrency:.2f}x at {r.max_model_len:,}"),
            ("largest max_model_len", f"{r.largest_max_model_len:,}"),
            ("cache-hit unit", f"{r.cache_hit_alignment} tokens"),
        ]),
        table_html(r.group_table),
    ]
    parts += [message_html(w, "warning") for w in r.warnings]
    if r.estimated:
        parts.append(message_html(f"estimated: {', '.join(r.estimated)}", "info"))
    parts.append(pre_html(r.explain()))
    return "".join(parts)


def _memory_axis(ax, r) -> None:
    parts = [("KV cache (given)", "kv_cache_memory", "#2980b9")]
    if not r.kv_cache_memory_given:
        parts = [("weights", "weight_bytes", "#7f8c8d"),
                 ("activations", "activation_peak_bytes", "#e67e22"),
                 ("non-torch", "non_torch_bytes", "#c0392b"),
                 ("CUDA graphs", "cudagraph_bytes", "#8e44ad"),
                 ("KV cache", "kv_cache_memory", "#2980b9")]
    left = 0.0
    for label, name, color in parts:
        gib = getattr(r, name) / GiB
        label += " (est.)" if name in r.estimated else ""
        ax.barh([0], [gib], left=left, color=color, label=f"{label}: {gib:.2f} GiB")
        left += gib
    if not r.kv_cache_memory_given:
        ax.axvline(r.requested_memory_bytes / GiB, color="k", lw=1, ls="--",
                   label=f"requested ({r.gpu_memory_utilization:g} x total)")
    ax.set_yticks([])
    ax.set_xlabel("GiB per rank")
    ax.set_title("GPU memory per rank")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)


def _prefix_axis(ax, reports: Sequence, lengths: Sequence[int], labels: Sequence[str]) -> None:
    styles = ("-", "--", "-.", ":")
    for i, (r, label) in enumerate(zip(reports, labels, strict=True)):
        usable = [n for n in lengths if n <= r.max_model_len]
        ax.step(usable, [r.prefix_hit_tokens(n) for n in usable], where="post",
                ls=styles[i % len(styles)], label=f"{label} (unit {r.cache_hit_alignment})")
    ax.plot([min(lengths), max(lengths)], [min(lengths), max(lengths)], color="0.7", lw=0.8,
            ls=":", label="every token")
    ax.set_xlabel("prompt tokens n")
    ax.set_ylabel("tokens a repeat reuses")
    ax.set_title("prefix-cache hits")
    ax.legend(fontsize=7)


def capacity_figure(r):
    """Memory breakdown per rank, and cached tokens vs prompt length."""
    fig = new_figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    _memory_axis(ax1, r)
    top = min(r.max_model_len, max(4 * r.cache_hit_alignment, 4096))
    lengths = list(range(1, top + 1, max(1, top // 400)))
    _prefix_axis(ax2, [r], lengths, [f"{r.plan.gpu.name} TP {r.plan.tensor_parallel_size}"])
    fig.subplots_adjust(bottom=0.35, wspace=0.3, top=0.8)
    fig.suptitle(plan_title(r.plan), fontsize=8, x=0.01, ha="left")
    return fig


def prefix_cache_figure(reports: Sequence, lengths: Sequence[int] | None = None):
    """Cached tokens vs prompt length for several reports (e.g. per GPU / TP)."""
    reports = list(reports)
    if not reports:
        raise KVExploreError("reports=[] is invalid; expected at least one CapacityReport")
    if lengths is None:
        top = max(4 * max(r.cache_hit_alignment for r in reports), 2048)
        lengths = list(range(1, top + 1, max(1, top // 500)))
    labels = [
        f"{r.plan.model.name.split('/')[-1]} {r.plan.gpu.name} TP "
        f"{r.plan.tensor_parallel_size}" for r in reports
    ]
    fig = new_figure(7, 4)
    ax = fig.subplots()
    _prefix_axis(ax, reports, lengths, labels)
    fig.tight_layout()
    return fig


def host_text(h) -> str:
    head = (
        f"{h.cpu_bytes_to_use:,} B of host memory: {h.num_chunks:,} chunks of "
        f"{h.aligned_kv_bytes_per_chunk:,} B -> {h.tokens:,} tokens "
        f"({h.host_bytes_per_token:,.1f} B per token; one rank's GPU bytes per token of one "
        f"group would promise {h.naive_tokens:,})"
    )
    return head + "\n" + h.explain()


def host_html(h) -> str:
    return pairs_html([
        ("cpu_bytes_to_use", f"{h.cpu_bytes_to_use:,}"),
        ("chunk bytes (aligned)", f"{h.aligned_kv_bytes_per_chunk:,}"),
        ("num_chunks", f"{h.num_chunks:,}"),
        ("host bytes per token", f"{h.host_bytes_per_token:,.1f}"),
        ("tokens", f"{h.tokens:,}"),
    ]) + pre_html(h.explain())


def host_figure(h):
    """Tokens the host tier holds vs what the naive GPU-bytes figure promises."""
    fig = new_figure(6, 2.4)
    ax = fig.subplots()
    ax.barh([1, 0], [h.naive_tokens, h.tokens], color=["#bdc3c7", "#27ae60"])
    ax.set_yticks([1, 0], ["GPU bytes/token\n(one rank, one group)", "vLLM CPU tier"])
    ax.set_xlabel("tokens of context")
    ax.set_title(f"{h.cpu_bytes_to_use / GiB:.1f} GiB cpu_bytes_to_use")
    fig.tight_layout()
    return fig


def chunks_text(c) -> str:
    return c.rule + "\nvalid: " + ", ".join(map(str, c.valid))


def chunks_html(c) -> str:
    return pre_html(chunks_text(c)) + table_html(c.table())


def chunks_figure(c):
    fig = new_figure(6, 1.8)
    ax = fig.subplots()
    top = max(c.valid[-1], *c.checked) if c.checked else c.valid[-1]
    ax.vlines(c.valid, 0, 1, color="#27ae60", label="valid chunk_size")
    for size, ok in c.checked.items():
        ax.plot([size], [0.5], "o" if ok else "x", color="#27ae60" if ok else "#c0392b")
    ax.set_xlim(0, top * 1.05)
    ax.set_yticks([])
    ax.set_xlabel("LMCache chunk_size (tokens)")
    ax.set_title(f"multiples of {c.hybrid_block_size}")
    fig.tight_layout()
    return fig


__all__ = [
    "capacity_figure", "capacity_html", "capacity_text", "chunks_figure", "chunks_html",
    "chunks_text", "host_figure", "host_html", "host_text", "prefix_cache_figure",
]
