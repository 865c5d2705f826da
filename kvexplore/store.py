"""The answer store: facts kvexplore computed before, on disk, by what they answer.

An answer (a plan's :meth:`~kvexplore.planning.planner.Plan.to_dict`, a
command's facts and text, a sweep's row) is a JSON value kept under the
:class:`Question` it answers: what is asked (its ``kind``), the model by
content, the GPU, the request, the command's own options and the releases
(the vLLM release, :func:`code_version`).  :meth:`Question.key` is the one
key; :func:`answer` is the one way an answer is read back or computed and
stored.

Entries are files under :func:`kvexplore.paths.store_dir`, one per question
(``<kind>/<2 hex>/<key>.json``, holding the question and the value),
written to a temporary file and moved into place with ``os.replace``, so a
reader never sees half an entry and concurrent processes may write the same
entry.  A hit refreshes the entry's modification time; :meth:`AnswerStore.prune`
removes the least recently used entries once the store holds more than
``max_bytes``, and the temporary files a killed writer left.  An entry that
cannot be read, is not JSON, records another question, or holds a value the
caller's check refuses (a directory in its place included) is a miss, with
one warning, and is removed (the caller builds the answer again); a store folder that cannot
be created or written is refused with a :class:`KVExploreError` when the
store is opened, before any work.

>>> import tempfile
>>> q = Question("demo", model={"name": "m", "digest": "0"}, options={"a": 1})
>>> with tempfile.TemporaryDirectory() as folder:
...     s = AnswerStore.open(folder)
...     s.put(q, {"answer": [1, 2]})
...     print(s.get(q), s.get(q.replace(options={"a": 2})))
{'answer': [1, 2]} None
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
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


#: The suffix of a writer's temporary file (renamed into place when complete).
TEMPORARY_SUFFIX = ".tmp"

#: A temporary file older than this many seconds is one a killed writer left.
TEMPORARY_SECONDS = 3600


def _json(value: Any) -> Any:
    return json.loads(canonical(value))


@dataclass(frozen=True, eq=False)
class Question:
    """What an answer answers: ``kind`` (``"plan"``, ``"offload"``,
    ``"capacity"``, a sweep row's kind), the ``model`` by content (``{"name":
    ..., "digest": ...}``), the ``gpu`` (its table fields), the ``request``
    (``plan()``'s normalised keywords, ``[[name, value], ...]``), the
    command's own ``options`` and the ``releases`` (the vLLM release and
    :func:`code_version`), each a
    JSON value (tuples become lists, other objects their text).  Two
    questions are equal when every field is; :meth:`key` is the SHA-256 of
    :meth:`to_json`.  Built for a deployment by
    :func:`kvexplore.planning.stored.question`."""

    kind: str
    model: Any = None
    gpu: Any = None
    request: Any = None
    options: Any = None
    releases: Any = None

    FIELDS = ("kind", "model", "gpu", "request", "options", "releases")

    def __post_init__(self):
        if not isinstance(self.kind, str) or not self.kind or "/" in self.kind:
            raise KVExploreError(f"kind={self.kind!r} is invalid; expected a name such as 'plan'")
        for name in self.FIELDS[1:]:
            object.__setattr__(self, name, _json(getattr(self, name)))

    def to_json(self) -> dict[str, Any]:
        """The question as a JSON object, one member per field."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def key(self) -> str:
        """The SHA-256 (hex) of :meth:`to_json` as :func:`canonical` JSON."""
        return hashlib.sha256(canonical(self.to_json()).encode()).hexdigest()

    def replace(self, **changes: Any) -> Question:
        """This question with ``changes`` to its fields."""
        return Question(**{**self.to_json(), **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Question) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


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

    def _path(self, question: Question) -> Path:
        digest = question.key()
        return self.root / question.kind / digest[:2] / f"{digest}.json"

    def _discard(self, path: Path, why: str) -> None:
        """Warn once that the entry at ``path`` is no answer (``why``) and
        remove it, a directory in its place included."""
        warnings.warn(f"kvexplore: store entry {path} {why}; removed, building the answer again",
                      stacklevel=3)
        with _quiet():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def get(self, question: Question, valid: Callable[[Any], bool] | None = None) -> Any | None:
        """The value stored for ``question``, or None.  An entry that cannot
        be read or decoded (for any reason: a directory, bytes that are not
        JSON, nesting ``json`` cannot follow), that records another question
        (another kind, model, GPU, request, options or release), or whose
        value ``valid`` refuses, is removed with one warning: None."""
        if not isinstance(question, Question):
            raise KVExploreError(f"question={question!r:.80} is invalid; expected a Question")
        path = self._path(question)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._discard(path, f"cannot be read ({exc.strerror or exc})")
            return None
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or "value" not in entry:
                raise ValueError("it holds no value")
            if canonical(entry.get("question")) != canonical(question.to_json()):
                raise ValueError("it answers another question")
            value = entry["value"]
            if valid is not None and not valid(value):
                raise ValueError(f"its value is not a {question.kind} answer")
        except Exception as exc:  # noqa: BLE001 - any entry that is no answer is a miss
            self._discard(path, f"is corrupt ({type(exc).__name__}: {str(exc)[:200]})")
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return value

    def put(self, question: Question, value: Any) -> None:
        """Store ``value`` (JSON, as :func:`canonical` writes it) for
        ``question``, with the question, atomically; a :class:`KVExploreError`
        naming the entry when it cannot be written."""
        path = self._path(question)
        data = json.dumps({"question": question.to_json(), "value": value}, default=str).encode()
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.",
                                       suffix=TEMPORARY_SUFFIX)
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

    def temporary_files(self) -> list[Path]:
        """The temporary files writers left (a killed process's half
        entries), older than :data:`TEMPORARY_SECONDS` (younger ones may be
        a running writer's)."""
        now = time.time()
        out = []
        for path in [*self.root.glob(f"*/*/.*{TEMPORARY_SUFFIX}"), *self.root.glob(".probe.*")]:
            try:
                if now - path.lstat().st_mtime > TEMPORARY_SECONDS:
                    out.append(path)
            except OSError:
                continue
        return out

    def prune(self) -> int:
        """Remove the temporary files writers left (:meth:`temporary_files`),
        then the least recently used entries until the store holds at most
        ``max_bytes``; the number of files removed."""
        removed = 0
        for path in self.temporary_files():
            with _quiet():
                path.unlink()
                removed += 1
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with _quiet():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
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


def answer(question: Question | None, compute: Callable[[], Any], store: Any = True, *,
           valid: Callable[[Any], bool] | None = None,
           enough: Callable[[Any], bool] | None = None) -> Any:
    """The answer to ``question``: read back from ``store``
    (:func:`answer_store`'s argument) when it holds one, else ``compute()``,
    stored for ``question`` and returned.  ``question`` None (an input that
    cannot be keyed: the computation gives its refusal) or ``store`` False
    computes and stores nothing.  ``valid`` checks a stored value's shape (a
    refused one is removed with a warning, :meth:`AnswerStore.get`);
    ``enough`` says whether a valid stored value answers this call (one that
    does not is computed again and replaced, without a warning).  An
    unwritable store is a :class:`KVExploreError` before ``compute`` runs."""
    s = answer_store(store) if question is not None else None
    if s is not None:
        hit = s.get(question, valid)
        if hit is not None and (enough is None or enough(hit)):
            return hit
    value = compute()
    if s is not None:
        s.put(question, value)
    return value


__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_VARIABLE",
    "TEMPORARY_SECONDS",
    "TEMPORARY_SUFFIX",
    "AnswerStore",
    "Question",
    "answer",
    "answer_store",
    "canonical",
    "code_version",
]
