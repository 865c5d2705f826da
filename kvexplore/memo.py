"""One memo per plan: derived results later stages compute from a ``Plan``.

Results live as long as their plan (a ``WeakKeyDictionary`` keyed by the
immutable plan); keys name the stage and the arguments (``("views", "unified")``).
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

    ``build`` runs outside the lock (the first stored value wins a race); a
    failing ``build`` runs again next time."""
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
