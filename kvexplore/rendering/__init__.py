"""Rendering: layouts as data (``layouts``), and every result's text, HTML
(``html``) and matplotlib figures (``figures``).

:func:`render` is the rendering half of the display protocol of
:mod:`kvexplore.display`: ``RENDERERS`` maps a result type's name to the
module and function names of its three forms.  Imported on first use, so
``import kvexplore`` does not pull in matplotlib.
"""

from __future__ import annotations

import importlib

from kvexplore.errors import KVExploreError

#: type name -> {form: "module:function"}; the function takes the result.
RENDERERS: dict[str, dict[str, str]] = {
    "Plan": {
        "text": "kvexplore.rendering.text:plan_text",
        "html": "kvexplore.rendering.html:plan_html",
        "figure": "kvexplore.rendering.layouts:plan_figure",
    },
    "PageLayout": {
        "text": "kvexplore.rendering.layouts:layout_text",
        "html": "kvexplore.rendering.html:page_layout_html",
        "figure": "kvexplore.rendering.figures:page_figure",
    },
    "BufferLayout": {
        "text": "kvexplore.rendering.layouts:layout_text",
        "html": "kvexplore.rendering.html:buffer_layout_html",
        "figure": "kvexplore.rendering.figures:buffer_figure",
    },
    "CapacityReport": {
        "text": "kvexplore.rendering.capacity:capacity_text",
        "html": "kvexplore.rendering.capacity:capacity_html",
        "figure": "kvexplore.rendering.capacity:capacity_figure",
    },
    "HostSizing": {
        "text": "kvexplore.rendering.capacity:host_text",
        "html": "kvexplore.rendering.capacity:host_html",
        "figure": "kvexplore.rendering.capacity:host_figure",
    },
    "ChunkSizes": {
        "text": "kvexplore.rendering.capacity:chunks_text",
        "html": "kvexplore.rendering.capacity:chunks_html",
        "figure": "kvexplore.rendering.capacity:chunks_figure",
    },
    "OffloadResult": {
        "text": "kvexplore.rendering.offload:offload_text",
        "html": "kvexplore.rendering.offload:offload_html",
        "figure": "kvexplore.rendering.offload:offload_figure",
    },
}

RENDERERS["EditResult"] = {
    "text": "kvexplore.rendering.editing:edit_result_text",
    "html": "kvexplore.rendering.editing:edit_result_html",
    "figure": "kvexplore.rendering.editing:edit_result_figure",
}
RENDERERS["RoundTripReport"] = {
    "text": "kvexplore.rendering.editing:roundtrip_text",
    "html": "kvexplore.rendering.editing:roundtrip_html",
    "figure": "kvexplore.rendering.editing:roundtrip_figure",
}


def render(form: str, obj):
    """``form`` of ``obj``: looked up by the names of ``type(obj)``'s classes."""
    for cls in type(obj).__mro__:
        entry = RENDERERS.get(cls.__name__)
        if entry is None:
            continue
        target = entry.get(form)
        if target is None:
            break
        module, func = target.split(":")
        return getattr(importlib.import_module(module), func)(obj)
    raise KVExploreError(
        f"{type(obj).__name__} has no {form!r} form; expected one of the types "
        f"{sorted(RENDERERS)}"
    )
