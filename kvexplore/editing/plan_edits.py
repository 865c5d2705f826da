"""LMCache's edits over a plan's ``meta``-device registration (exact strides,
no memory), computed once per plan and registration."""

from __future__ import annotations

from kvexplore.editing.lmcache import lmcache_release
from kvexplore.editing.rules import apply_kv_cache_group_edits
from kvexplore.memo import per_plan
from kvexplore.registration import registered_views


def plan_edits(plan, registration: str = "unified", *, lmcache: object = None):
    """``apply_kv_cache_group_edits`` of LMCache ``lmcache`` (``None``: the
    installed one, else the newest stable) over
    :func:`~kvexplore.registration.registered_views`.

    Raises ``KVExploreError`` when the edits reject the configuration (e.g. a
    Mamba group with ``mamba_cache_mode='none'``); the error is not kept, so
    the next call raises afresh.
    """
    views = registered_views(plan, registration)

    def build():
        return apply_kv_cache_group_edits(plan.kv_cache_config, views, lmcache=release)

    release = lmcache_release(lmcache)
    return per_plan(plan, ("edits", registration, release.version), build)
