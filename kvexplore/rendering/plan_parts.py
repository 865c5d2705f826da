"""Text, HTML and figures of a plan's parts: its ``Admission`` (vLLM's
start-up verdict on the cache) and its ``Drafter`` (what a
``speculative_config`` adds).

>>> from kvexplore.planning.drafter import Drafter
>>> drafter_text(Drafter("ngram", 3, None, None, (), 0, 1))
'ngram x 3 draft tokens: no draft model, so no KV cache layers are added'
"""

from __future__ import annotations

from html import escape

from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html


def admission_text(admission) -> str:
    """``Admission.text()``: its one-line verdict (``Admission.summary``)."""
    return admission.summary()


def admission_html(admission) -> str:
    """:func:`admission_text` in a box: ``info`` when admitted, ``error`` when refused."""
    return message_html(admission_text(admission), "info" if admission.ok else "error")


def _bars(ax, labels, values, colours, unit: str, fmt: str) -> None:
    ax.barh(labels, values, color=colours)
    for y, value in enumerate(values):
        ax.annotate(fmt.format(value), (value, y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.margins(x=0.25)


def admission_figure(admission):
    """The start-up verdict drawn: what one request of ``max_model_len``
    needs beside what the cache holds (GiB), and, for a cache with Mamba
    layers under full CUDA graphs, the sequences ``max_num_seqs`` asks
    beside the blocks there are (each decoding sequence holds one); a bar
    is red where its check refuses.  The title names the first check that
    refuses, or every check that passed."""
    gib = 1 << 30
    graphs = next((c for c in admission.checks if c.name == "cudagraph_mode"), None)
    seqs = graphs is not None and graphs.inputs.get("has_mamba_layers") and \
        "FULL" in str(graphs.outcome or graphs.inputs.get("cudagraph_mode", ""))
    fig = new_figure(6.0, 3.2 if seqs else 1.8)
    axes = fig.subplots(2 if seqs else 1, 1, squeeze=False)[:, 0]
    red, green, blue = "#C44E52", "#55A868", "#4C72B0"
    _bars(axes[0], [f"one request of {admission.max_model_len:,} tokens", "the cache holds"],
          [admission.needed_bytes / gib, admission.available_bytes / gib],
          [green if admission.memory_ok else red, blue], "GiB", "{:,.2f} GiB")
    if seqs:
        _bars(axes[1], [f"max_num_seqs ({graphs.inputs['max_num_seqs']:,})",
                        f"Mamba blocks ({graphs.inputs['num_blocks']:,})"],
              [graphs.inputs["max_num_seqs"], graphs.inputs["num_blocks"]],
              [green if graphs.ok else red, blue], "sequences / blocks", "{:,}")
    first = admission.refused_by
    title = (f"refused by {admission.release}: {first.name}" if first is not None
             else "admitted: " + ", ".join(c.name for c in admission.checks))
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def drafter_text(drafter) -> str:
    """``Drafter.text()``: the method, its speculator and the layers it adds
    in one line (``Drafter.summary``)."""
    return drafter.summary()


def drafter_html(drafter) -> str:
    """:func:`drafter_text`, then every draft layer's name."""
    layers = "".join(
        f"<li><code>{escape(name)}</code></li>" for name in drafter.layer_names
    )
    return (
        f"<div><p>{escape(drafter_text(drafter))}</p>"
        f"{f'<ul>{layers}</ul>' if layers else ''}</div>"
    )


__all__ = [
    "admission_figure",
    "admission_html",
    "admission_text",
    "drafter_html",
    "drafter_text",
]
