"""The answer store: facts kvexplore computed before, on disk, by what they answer.

An answer (a plan's :meth:`~kvexplore.planning.planner.Plan.to_dict`, a
sweep's rows) is a JSON value kept under a key, a JSON object naming
everything the answer depends on (the vLLM release, :func:`code_version`, the
model config's digest, the GPU and the normalised request): the same key is
the same answer, so a repeated question is read back instead of built.

Entries are files under :func:`kvexplore.paths.store_dir`, one per key
(``<kind>/<2 hex>/<sha256 of the key>.json``, holding the key and the value),
written to a temporary file and moved into place with ``os.replace``, so a
reader never sees half an entry and concurrent processes may write the same
entry.  A hit refreshes the entry's modification time; :meth:`AnswerStore.prune`
removes the least recently used entries once the store holds more than
``max_bytes``.  An unreadable or corrupt entry is a miss, with a warning, and
is removed (the caller builds the answer again); a store folder that cannot
be created or written is refused with a :class:`KVExploreError` when the
store is opened, before any work.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as folder:
...     s = AnswerStore.open(folder)
...     s.put("demo", {"a": 1}, {"answer": [1, 2]})
...     print(s.get("demo", {"a": 1}), s.get("demo", {"a": 2}))
{'answer': [1, 2]} None
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.paths import store_dir
from kvexplore.version import VERSION

#: Default size cap of the store, in bytes (``$KVEXPLORE_STORE_MAX_BYTES`` overrides).
DEFAULT_MAX_BYTES = 256 * 1024**2

#: Environment variable overriding :data:`DEFAULT_MAX_BYTES`.
MAX_BYTES_VARIABLE = "KVEXPLORE_STORE_MAX_BYTES"

#: A put prunes the store with this probability (a sweep prunes once at its end).
PRUNE_CHANCE = 1 / 64


@functools.cache
def code_version() -> str:
    """kvexplore's release and the SHA-256 of its source files (``VERSION+<12
    hex>``): an answer from other code is another key."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return f"{VERSION}+{h.hexdigest()[:12]}"


def canonical(value: Any) -> str:
    """``value`` as canonical JSON text (sorted keys; tuples as lists; other
    objects by ``str``): the form keys are hashed and values stored in."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def _max_bytes() -> int:
    given = os.environ.get(MAX_BYTES_VARIABLE)
    if not given:
        return DEFAULT_MAX_BYTES
    try:
        value = int(given)
    except ValueError:
        value = -1
    if value < 0:
        raise KVExploreError(
            f"${MAX_BYTES_VARIABLE}={given!r} is invalid; expected a number of bytes >= 0"
        )
    return value


@dataclass(frozen=True)
class AnswerStore:
    """A store folder (see the module doc); make one with :meth:`open`."""

    root: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def open(cls, root: str | os.PathLike | None = None,
             max_bytes: int | None = None) -> AnswerStore:
        """The store at ``root`` (default :func:`kvexplore.paths.store_dir`),
        created if missing; a :class:`KVExploreError` naming the folder when
        it is a file, cannot be created or is not writable (tried by writing
        a temporary file)."""
        path = Path(root).expanduser() if root is not None else store_dir()
        fix = ("expected a writable folder (set $KVEXPLORE_STORE_DIR or $KVEXPLORE_CACHE_DIR "
               "to one, or skip the store: store=False, --no-cache)")
        if path.exists() and not path.is_dir():
            raise KVExploreError(f"answer store {str(path)!r} is not a folder; {fix}")
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".probe."):
                pass
        except OSError as exc:
            raise KVExploreError(
                f"answer store {str(path)!r} cannot be written ({exc.strerror or exc}); {fix}"
            ) from None
        return cls(path, _max_bytes() if max_bytes is None else max_bytes)

    def _path(self, kind: str, key: Any) -> tuple[Path, str]:
        text = canonical(key)
        digest = hashlib.sha256(f"{kind}\n{text}".encode()).hexdigest()
        return self.root / kind / digest[:2] / f"{digest}.json", text

    def get(self, kind: str, key: Any) -> Any | None:
        """The value stored under ``(kind, key)``, or None.  A corrupt entry
        (not JSON, another key, no value) is removed with a warning: None."""
        path, text = self._path(kind, key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(f"kvexplore: store entry {path} cannot be read ({exc}); "
                          "building the answer again", stacklevel=2)
            return None
        try:
            entry = json.loads(raw)
            if canonical(entry["key"]) != text:
                raise ValueError("it holds another key")
            value = entry["value"]
        except (ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"kvexplore: store entry {path} is corrupt ({exc}); "
                          "removed, building the answer again", stacklevel=2)
            try:
                path.unlink()
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return value

    def put(self, kind: str, key: Any, value: Any) -> None:
        """Store ``value`` (JSON, as :func:`canonical` writes it) under
        ``(kind, key)``, atomically; a :class:`KVExploreError` naming the
        entry when it cannot be written."""
        path, _ = self._path(kind, key)
        data = json.dumps({"key": key, "value": value}, default=str).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                with _quiet():
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise KVExploreError(
                f"answer store entry {str(path)!r} cannot be written ({exc.strerror or exc}); "
                "expected a writable store folder (or store=False, --no-cache)"
            ) from None
        if random.random() < PRUNE_CHANCE:
            self.prune()

    def entries(self) -> list[tuple[float, int, Path]]:
        """``(modification time, bytes, path)`` of every entry."""
        out = []
        for path in self.root.glob("*/*/*.json"):
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size, path))
        return out

    def prune(self) -> int:
        """Remove the least recently used entries until the store holds at
        most ``max_bytes``; the number removed."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with _quiet():
                path.unlink()
                removed += 1
            total -= size
        return removed


class _quiet:
    """Ignore an ``OSError`` (a file another process removed first)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, OSError)


def answer_store(store: Any = True) -> AnswerStore | None:
    """The store a ``store=`` argument names: ``True`` the user's
    (:func:`kvexplore.paths.store_dir`), ``False``/``None`` none, a path or
    an :class:`AnswerStore` that one; anything else is a :class:`KVExploreError`."""
    if store is None or store is False:
        return None
    if store is True:
        return AnswerStore.open()
    if isinstance(store, AnswerStore):
        return store
    if isinstance(store, (str, os.PathLike)):
        return AnswerStore.open(store)
    raise KVExploreError(
        f"store={store!r} is invalid; expected True (the user's store), False, "
        "a folder path or an AnswerStore"
    )


__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_VARIABLE",
    "AnswerStore",
    "answer_store",
    "canonical",
    "code_version",
]
