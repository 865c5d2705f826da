"""Rendering: layouts as data, and every result's text, HTML and figures.

Importing it registers :data:`FORMS` with :mod:`kvexplore.display`'s
``text_form`` / ``html_form`` / ``figure_form``
(:func:`~kvexplore.display.register_forms`): the forms of every result type
of the stages before it and of its own.  :mod:`kvexplore.display` imports it
on a result's first lookup that finds no form, so the forms are there whether
or not a caller imported this stage.
"""

from __future__ import annotations

from kvexplore.advising import Advice, ReleaseAdvice
from kvexplore.capacity_planning import Calibration, CapacityReport
from kvexplore.connectors.lmcache_layout import LMCacheLayout
from kvexplore.display import register_forms
from kvexplore.editing.roundtrip import RoundTripReport
from kvexplore.editing.rules import EditResult
from kvexplore.logs.checking import LogCheck
from kvexplore.logs.reading import VllmLog
from kvexplore.offloading.config import OffloadResult
from kvexplore.offloading.sizing import ChunkSizes, HostSizing
from kvexplore.planning.admission import Admission
from kvexplore.planning.drafter import Drafter
from kvexplore.planning.planner import Plan
from kvexplore.rendering import (
    advice,
    capacity,
    editing,
    figures,
    html,
    layouts,
    lmcache,
    logs,
    offload,
    plan_parts,
)

#: Each result type -> its ``(text, html, figure)`` forms (``None``: it has no such form).
FORMS = {
    Plan: (layouts.plan_text, html.plan_html, layouts.plan_figure),
    Admission: (plan_parts.admission_text, plan_parts.admission_html,
                plan_parts.admission_figure),
    Drafter: (plan_parts.drafter_text, plan_parts.drafter_html, None),
    layouts.PageLayout: (layouts.page_layout_text, html.page_layout_html, figures.page_figure),
    layouts.BufferLayout: (layouts.buffer_layout_text, html.buffer_layout_html,
                           figures.buffer_figure),
    CapacityReport: (capacity.capacity_text, capacity.capacity_html, capacity.capacity_figure),
    HostSizing: (capacity.host_text, capacity.host_html, capacity.host_figure),
    ChunkSizes: (capacity.chunks_text, capacity.chunks_html, capacity.chunks_figure),
    OffloadResult: (offload.offload_text, offload.offload_html, offload.offload_figure),
    EditResult: (editing.edit_result_text, editing.edit_result_html, editing.edit_result_figure),
    RoundTripReport: (editing.roundtrip_text, editing.roundtrip_html, editing.roundtrip_figure),
    editing.EditGroup: (editing.edit_group_text, editing.edit_group_html, None),
    VllmLog: (logs.log_text, logs.log_html, logs.log_figure),
    LogCheck: (logs.check_text, logs.check_html, logs.check_figure),
    Calibration: (logs.calibration_text, logs.calibration_html, logs.calibration_figure),
    LMCacheLayout: (lmcache.lmcache_text, lmcache.lmcache_html, lmcache.lmcache_figure),
    Advice: (advice.advice_text, advice.advice_html, advice.advice_figure),
    ReleaseAdvice: (advice.release_advice_text, advice.release_advice_html,
                    advice.release_advice_figure),
}

register_forms(FORMS)

__all__ = ["FORMS"]
