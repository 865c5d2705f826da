"""What LMCache stores drawn: :class:`~kvexplore.connectors.lmcache_layout.LMCacheLayout`
as text, HTML and a figure.

The figure puts one chunk of LMCache beside vLLM's blocks for the same
tokens: per vLLM group the bytes vLLM holds for the chunk's tokens (its
blocks' pages over the group's layers), per LMCache kernel group the bytes one
chunk stores; attention blue, recurrent state orange.  A refused deployment is
drawn with the release's message in red over vLLM's side.
"""

from __future__ import annotations

from html import escape

from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html, pre_html, table_html

ATTENTION, RECURRENT = "#4C72B0", "#DD8452"


def _head(layout) -> str:
    p = layout.plan
    chunk = f"chunk {layout.chunk_size:,} tokens"
    if layout.chunk_size != layout.asked_chunk_size:
        chunk += f" (--chunk-size {layout.asked_chunk_size:,} negotiated up)"
    return (f"{layout.release} (LMCacheMPConnector) with {p.served_model} on {p.gpu.name}, "
            f"vLLM {p.vllm_version}: {chunk}")


def _verdict(layout) -> str:
    if layout.accepted:
        return (f"accepted: one chunk stores {layout.chunk_bytes:,} B "
                f"({layout.bytes_per_token:,.1f} B per token)")
    r = layout.refusal
    smallest = layout.smallest_chunk()
    way = (f"; the smallest chunk it accepts: {smallest:,}" if smallest
           else "; no chunk size is accepted while this check refuses")
    return f"refused by {r.name} ({r.where}): {r.error}: {r.message}{way}"


def _facts(layout) -> list[str]:
    return [
        f"scheduler block {layout.scheduler_block:,} tokens; groups' tokens per block "
        f"{list(layout.group_tokens_per_block)}; hit alignment {layout.hit_alignment:,}",
        f"object groups separated: {layout.separate_object_groups} (release default "
        f"{layout.separate_object_groups_default}); engine type {layout.engine_type}; "
        f"last prompt token held back from lookups: {layout.reserve_last_token}",
        "server flags: " + " ".join(layout.server_flags()),
    ]


KERNEL_COLUMNS = ("kernel_group", "engine_group", "layer_indices", "kv_size", "num_heads",
                  "head_size", "dtype", "tokens_per_block", "slots_per_block",
                  "window_tokens", "slots_per_chunk", "recurrent_state", "chunk_bytes")


def lmcache_text(layout) -> str:
    import pandas as pd

    lines = [_head(layout), _verdict(layout), *_facts(layout),
             *(f"warning: {w}" for w in layout.warnings)]
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        if not layout.kernel_groups.empty:
            cols = [c for c in KERNEL_COLUMNS if c in layout.kernel_groups]
            lines += ["", "kernel groups (one chunk):", layout.kernel_groups[cols].to_string()]
        if not layout.object_groups.empty:
            lines += ["", "object groups:", layout.object_groups.to_string()]
        lines += ["", "checks:", layout.check_table[["name", "ok", "where"]].to_string()]
    return "\n".join(lines)


def lmcache_html(layout) -> str:
    parts = [f"<b>{escape(_head(layout))}</b>",
             message_html(_verdict(layout), "info" if layout.accepted else "error"),
             pre_html("\n".join(_facts(layout))),
             *(message_html(w, "warning") for w in layout.warnings)]
    if not layout.kernel_groups.empty:
        cols = [c for c in KERNEL_COLUMNS if c in layout.kernel_groups]
        parts += ["<div>kernel groups (one chunk)</div>", table_html(layout.kernel_groups, cols)]
    parts += ["<div>checks</div>", table_html(layout.check_table)]
    return "".join(parts)


def _vllm_bars(layout):
    """Per vLLM group: the bytes vLLM's blocks hold for one chunk's tokens."""
    labels, values, colours = [], [], []
    for row in layout.vllm_blocks.to_dict("records"):
        blocks = -(-layout.chunk_size // row["block_size"])
        recurrent = "Mamba" in row["spec"]
        labels.append(f"vLLM group {row['group']} ({row['spec']}, {blocks} block(s) x "
                      f"{row['layers']} layers)")
        values.append(blocks * row["page_bytes"] * row["layers"])
        colours.append(RECURRENT if recurrent else ATTENTION)
    return labels, values, colours


def lmcache_figure(layout):
    labels, values, colours = _vllm_bars(layout)
    n_vllm = len(labels)
    for row in layout.kernel_groups.to_dict("records") if layout.accepted else ():
        labels.append(f"LMCache kernel group {row['kernel_group']} ({len(row['layer_indices'])} "
                      f"layers, {row['slots_per_chunk']:,} slots)")
        values.append(row["chunk_bytes"])
        colours.append(RECURRENT if row["recurrent_state"] else ATTENTION)
    fig = new_figure(9, 0.45 * len(labels) + 1.6)
    ax = fig.add_subplot(1, 1, 1)
    y = list(range(len(labels)))[::-1]
    ax.barh(y, [v / 2**20 for v in values], color=colours, edgecolor="black", linewidth=0.4)
    for yy, v in zip(y, values, strict=True):
        ax.text(v / 2**20, yy, f" {v / 2**20:,.2f} MiB", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    if n_vllm and len(labels) > n_vllm:
        ax.axhline(y[n_vllm - 1] - 0.5, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"MiB for one chunk of {layout.chunk_size:,} tokens")
    ax.set_title(_head(layout), fontsize=9)
    if not layout.accepted:
        r = layout.refusal
        ax.text(0.02, 0.02, f"refused by {r.name}: {r.message[:140]}", transform=ax.transAxes,
                color="red", fontsize=8, wrap=True)
    ax.margins(x=0.25)
    fig.tight_layout()
    return fig
