"""Text, HTML and a figure of an :class:`~kvexplore.offloading.config.OffloadResult`."""

from __future__ import annotations

from html import escape

from kvexplore.offloading.derive import group_bytes_per_block
from kvexplore.planning import release
from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import table_html

#: Colours of the figure: GPU blocks alternate, the chunk is outlined.
_BLOCK_COLORS = ("#4c78a8", "#9ecae9")
_MAX_DRAWN_BLOCKS = 64
#: Where a bar's note sits: just right of the bar's end.
_NOTE = {"xytext": (4, 0), "textcoords": "offset points", "va": "center", "fontsize": 7}


def offload_text(result) -> str:
    """One line per derived field: ``field = value: rule``."""
    return "\n".join(f"{r.field} = {r.value}: {r.rule}" for r in result.rows() if r.rule)


def offload_html(result) -> str:
    """The heading and every field with its rule, as one escaped table."""
    c = result.config
    head = (
        f"<b>OffloadingConfig</b> for {escape(result.plan.model.name)} "
        f"(TP {c.parallel.tp_size}, DCP {c.parallel.dcp_size}, PP {c.parallel.pp_size})"
    )
    rows = [r._asdict() for r in result.rows()]
    return f"<div>{head}{table_html(rows, ['field', 'value', 'rule'])}</div>"


def offload_figure(result):
    """Per offloaded group: one offloaded chunk as its GPU blocks (tokens,
    left, with the chunks a sliding window keeps) and the bytes of one GPU
    block of the group (right), with ``worker_kv_bytes_per_block`` dashed."""
    c = result.config
    kv_groups = result.plan.groups
    bpc = c.cache.blocks_per_chunk
    n = len(c.groups)
    fig = new_figure(10, 1.5 + 0.45 * n)
    ax_tok, ax_bytes = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    labels = []
    for y, g in enumerate(c.groups):
        kv = kv_groups[g.group_id]
        spec = type(kv.kv_cache_spec).__name__
        labels.append(f"group {g.group_id}: {spec} x {len(g.layer_names)}")
        t = g.tokens_per_block
        drawn = min(bpc, _MAX_DRAWN_BLOCKS)
        ax_tok.broken_barh(
            [(i * t, t) for i in range(drawn)],
            (y - 0.35, 0.7),
            facecolors=[_BLOCK_COLORS[i % 2] for i in range(drawn)],
            edgecolors="#222222",
            linewidth=0.5,
        )
        more = f" ({bpc - drawn} more)" if bpc > drawn else ""
        window = g.sliding_window_size_in_chunks if release.offloading_has_windows() else None
        kept = "" if window is None else f"; keeps {window} chunk(s)"
        ax_tok.annotate(f"{bpc} x {t} = {bpc * t} tokens{more}{kept}", (drawn * t, y), **_NOTE)
        block_bytes = group_bytes_per_block(kv)
        ax_bytes.barh(y, block_bytes, height=0.7, color=_BLOCK_COLORS[0], edgecolor="#222222", linewidth=0.5)
        ax_bytes.annotate(f"{block_bytes:,} B", (block_bytes, y), **_NOTE)
    ax_bytes.axvline(c.worker_kv_bytes_per_block, color="#c0392b", linestyle="--", linewidth=1)
    ax_tok.set_yticks(range(n))
    ax_tok.set_yticklabels(labels, fontsize=7)
    ax_tok.set_ylim(n - 0.5, -0.5)
    ax_tok.set_xlabel(f"tokens: one offloaded chunk = {bpc} GPU block(s)", fontsize=8)
    ax_bytes.set_xlabel(
        f"bytes of one GPU block of the group\n(dashed: worker_kv_bytes_per_block "
        f"{c.worker_kv_bytes_per_block:,} B)",
        fontsize=8,
    )
    for ax, room in ((ax_tok, 1.8), (ax_bytes, 1.45)):  # room for the notes
        ax.tick_params(labelsize=7)
        right = ax.get_xlim()[1]
        ax.set_xlim(0, right * room if right > 0 else 1)
    p, backend = result.plan, result.derivation.distributed_executor_backend.value
    fig.suptitle(f"{p.model.name} on {p.gpu.name}: TP {c.parallel.tp_size}, DCP {c.parallel.dcp_size}, "
                 f"attention backend {p.attention_backend or '-'}, executor {backend}", fontsize=9)
    fig.tight_layout()
    return fig


__all__ = ["offload_figure", "offload_html", "offload_text"]
