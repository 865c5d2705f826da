"""Where kvexplore keeps what it writes: one cache folder per user.

``$KVEXPLORE_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/kvexplore`` (by
default ``~/.cache/kvexplore``).  Everything in it is keyed by content or by
release, written atomically, safe for concurrent processes, and never needs
cleaning up at exit: ``configs/<digest>/`` holds the ``config.json`` files vLLM
reads, ``envs/vllm-<release>/`` one environment per vLLM release,
``answers/`` the answer store (:mod:`kvexplore.store`; ``$KVEXPLORE_STORE_DIR``
puts it elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvexplore.errors import KVExploreError

#: Environment variable naming kvexplore's cache folder.
CACHE_DIR_VARIABLE = "KVEXPLORE_CACHE_DIR"

#: Environment variable naming the answer store's folder.
STORE_DIR_VARIABLE = "KVEXPLORE_STORE_DIR"


def cache_dir() -> Path:
    """kvexplore's cache folder (see the module doc); not created here."""
    given = os.environ.get(CACHE_DIR_VARIABLE)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvexplore"


def cache_folder(*parts: str) -> Path:
    """``cache_dir() / parts...``, created (with its parents) when missing.

    Refused with a :class:`KVExploreError` naming ``$KVEXPLORE_CACHE_DIR``
    (or the default folder), the path and what is expected when the folder
    cannot be made or written: the cache folder or one above it is a file,
    or it is not writable."""
    folder = cache_dir().joinpath(*parts)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {folder}")
    except OSError as exc:
        given = os.environ.get(CACHE_DIR_VARIABLE)
        name = f"{CACHE_DIR_VARIABLE}={given!r}" if given else f"the cache folder {cache_dir()}"
        raise KVExploreError(
            f"{name} cannot hold {folder} ({type(exc).__name__}: {exc.strerror or exc}); "
            f"expected a writable folder (set {CACHE_DIR_VARIABLE} to one)"
        ) from None
    return folder


def store_dir() -> Path:
    """The answer store's folder: ``$KVEXPLORE_STORE_DIR`` when set, else
    ``cache_dir() / "answers"``; not created here."""
    given = os.environ.get(STORE_DIR_VARIABLE)
    if given:
        return Path(given).expanduser()
    return cache_dir() / "answers"


__all__ = ["CACHE_DIR_VARIABLE", "STORE_DIR_VARIABLE", "cache_dir", "cache_folder", "store_dir"]
