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


def admission_figure(admission):
    """Two bars on one byte axis (GiB): what one request of ``max_model_len``
    needs and what the cache holds, the first red when refused."""
    gib = 1 << 30
    fig = new_figure(6.0, 1.8)
    ax = fig.subplots()
    labels = [f"one request of {admission.max_model_len:,} tokens", "the cache holds"]
    values = [admission.needed_bytes / gib, admission.available_bytes / gib]
    colours = ["#55A868" if admission.ok else "#C44E52", "#4C72B0"]
    ax.barh(labels, values, color=colours)
    for y, value in enumerate(values):
        ax.annotate(
            f"{value:,.2f} GiB",
            (value, y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    ax.margins(x=0.25)
    ax.set_title(
        "admitted" if admission.ok else f"refused by {admission.release}", fontsize=9
    )
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
