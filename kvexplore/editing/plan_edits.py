"""LMCache's edits over a plan's ``meta``-device registration (exact strides,
no memory), computed once per plan and registration."""

from __future__ import annotations

from kvexplore.editing.rules import apply_kv_cache_group_edits
from kvexplore.memo import per_plan
from kvexplore.registration import registered_views


def plan_edits(plan, registration: str = "unified"):
    """``apply_kv_cache_group_edits`` over :func:`~kvexplore.registration.registered_views`.

    Raises ``KVExploreError`` when the edits reject the configuration (e.g. a
    Mamba group with ``mamba_cache_mode='none'``); the error is not kept, so
    the next call raises afresh.
    """
    views = registered_views(plan, registration)

    def build():
        return apply_kv_cache_group_edits(
            plan.kv_cache_config, views, kv_layout=plan.kv_cache_layout.name
        )

    return per_plan(plan, ("edits", registration), build)
