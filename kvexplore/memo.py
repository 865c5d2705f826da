"""One memo per plan: derived results later stages compute from a ``Plan``.

Plans are immutable and hashed by identity, so a result derived from a plan
(its meta-device registration, LMCache's edits over it, the offloading facts,
a rendered figure) can be kept for exactly as long as the plan lives: the
memo is a ``WeakKeyDictionary`` keyed by the plan, and an entry goes when its
plan is collected.  Keys inside a plan's memo are tuples naming the stage and
the arguments (``("views", "unified")``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def per_plan(plan: Any, key: Hashable, build: Callable[[], T]) -> T:
    """``build()`` once per (``plan``, ``key``); later calls return the same object.

    ``build`` runs outside the lock (it may be slow, or itself memoise); when
    two threads race, the first stored value wins and both return it.
    Exceptions are not stored: a failing ``build`` runs again next time.
    """
    with _LOCK:
        entries = _MEMO.get(plan)
        if entries is not None and key in entries:
            return entries[key]
    value = build()
    with _LOCK:
        entries = _MEMO.setdefault(plan, {})
        return entries.setdefault(key, value)


def keys(plan: Any) -> list:
    """The keys memoised for ``plan`` so far."""
    if plan is None:
        return []
    with _LOCK:
        return list(_MEMO.get(plan, {}))
