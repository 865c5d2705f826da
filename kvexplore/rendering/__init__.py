"""Rendering: layouts as data (``layouts``), and every result's text, HTML
(``html``) and matplotlib figures (``figures``).

Importing this package registers each result class's three forms with the
display protocol's ``singledispatch`` functions
(:func:`kvexplore.display.text_form`, :func:`~kvexplore.display.html_form`,
:func:`~kvexplore.display.figure_form`).  matplotlib is imported only when a
figure is drawn.
"""

from __future__ import annotations

from kvexplore.capacity_planning import CapacityReport
from kvexplore.display import figure_form, html_form, text_form
from kvexplore.editing.roundtrip import RoundTripReport
from kvexplore.editing.rules import EditResult
from kvexplore.offloading.config import OffloadResult
from kvexplore.offloading.sizing import ChunkSizes, HostSizing
from kvexplore.planning.planner import Plan
from kvexplore.rendering import capacity, editing, figures, html, layouts, offload, text

FORMS = {
    Plan: (text.plan_text, html.plan_html, layouts.plan_figure),
    layouts.PageLayout: (layouts.page_layout_text, html.page_layout_html, figures.page_figure),
    layouts.BufferLayout: (layouts.buffer_layout_text, html.buffer_layout_html,
                           figures.buffer_figure),
    CapacityReport: (capacity.capacity_text, capacity.capacity_html, capacity.capacity_figure),
    HostSizing: (capacity.host_text, capacity.host_html, capacity.host_figure),
    ChunkSizes: (capacity.chunks_text, capacity.chunks_html, capacity.chunks_figure),
    OffloadResult: (offload.offload_text, offload.offload_html, offload.offload_figure),
    EditResult: (editing.edit_result_text, editing.edit_result_html, editing.edit_result_figure),
    RoundTripReport: (editing.roundtrip_text, editing.roundtrip_html, editing.roundtrip_figure),
}

for _cls, (_text, _html, _figure) in FORMS.items():
    text_form.register(_cls, _text)
    html_form.register(_cls, _html)
    figure_form.register(_cls, _figure)

__all__ = ["FORMS"]
