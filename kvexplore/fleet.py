"""Fleet sweeps: tasks on an executor or a Dask cluster, rows written as they come.

:func:`run_tasks` runs a sweep's tasks (one per plan) on any
``concurrent.futures.Executor`` or on a ``dask.distributed.Client`` (the
``Client.submit`` / ``Future`` API, which ``Client.get_executor()`` wraps),
batched so a worker plans neighbouring tasks (the same model, then the same
build inputs) one after the other and reuses its build; results come back in
task order, and each batch's results are handed to ``on_result`` as it
arrives.  :class:`RowFile` keeps a sweep's rows in a Parquet or CSV file,
rewritten atomically (temporary file + ``os.replace``) as rows arrive, every
row stamped with the installed vLLM release (:data:`RELEASE_COLUMN`), so a
re-run with the same file skips the rows that release wrote there.
:func:`resumable_sweep` is the one skeleton both sweeps run: each task's rows
from the file (checked against their keys), else the answer store, else
computed, stored and written as they arrive.  Only kvexplore's
functions and plain Python values travel to the workers, never vLLM objects.
"""

from __future__ import annotations

import ast
import json
import math
import os
import queue
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.planning.release import installed_release
from kvexplore.store import canonical

#: Seconds between two rewrites of a :class:`RowFile` while rows arrive.
FLUSH_SECONDS = 1.0

#: Batches per worker slot: enough for the cluster to balance its load.
BATCHES_PER_WORKER = 4

#: Output formats, by file suffix.
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}

#: The column :class:`RowFile` adds to every row it writes: the installed vLLM
#: release (:func:`kvexplore.planning.release.installed_release`) that computed it.
RELEASE_COLUMN = "vllm"


# ---------------------------------------------------------------------------
# Executors
# ---------------------------------------------------------------------------


def is_dask_client(executor: Any) -> bool:
    """Whether ``executor`` is a ``dask.distributed.Client`` (by its class,
    without importing dask)."""
    return type(executor).__module__.startswith("distributed") and hasattr(executor, "nthreads")


def check_executor(executor: Any) -> None:
    """Refuse, before any work, an ``executor`` that is neither a
    ``concurrent.futures.Executor``-like object (a ``submit`` method) nor a
    running ``dask.distributed.Client``."""
    if executor is None:
        return
    if not callable(getattr(executor, "submit", None)):
        raise KVExploreError(
            f"executor={executor!r:.80} has no submit(); expected a concurrent.futures.Executor "
            "(ProcessPoolExecutor, dask's Client.get_executor()) or a dask.distributed.Client"
        )
    if is_dask_client(executor) and getattr(executor, "status", "running") != "running":
        raise KVExploreError(
            f"executor={executor!r:.80} is {executor.status}; expected a running "
            "dask.distributed.Client (open one with Client(cluster) or Client('tcp://...'))"
        )


def worker_slots(executor: Any) -> int:
    """Tasks ``executor`` runs at once: a Dask client's threads over all
    workers, else this machine's cores."""
    if is_dask_client(executor):
        try:
            return max(1, sum(executor.nthreads().values()))
        except Exception:  # noqa: BLE001 - a client that cannot tell still runs tasks
            return 1
    return max(1, os.cpu_count() or 1)


def run_batch(function: Callable, tasks: Sequence[tuple]) -> list:
    """``[function(*task) for task in tasks]``: one submitted batch, run in order
    in one worker process (each task after the first reuses its caches)."""
    return [function(*task) for task in tasks]


def batches(tasks: Sequence[tuple], count: int, key: Callable[[tuple], Any]) -> list[list[int]]:
    """Task indices in ``count`` contiguous batches (or fewer) after a stable
    sort by ``key`` (a sweep's model and build inputs), so neighbours share a worker."""
    order = sorted(range(len(tasks)), key=lambda i: key(tasks[i]))
    size = max(1, math.ceil(len(order) / max(1, count)))
    return [order[i:i + size] for i in range(0, len(order), size)]


def _task_key(task: tuple) -> str:
    return canonical(list(task[:2]))


def _progress(total: int, what: str):
    from tqdm.auto import tqdm

    # tqdm's notebook bar ignores TQDM_DISABLE, which the console bar honours
    off = os.getenv("TQDM_DISABLE", "").lower() not in ("", "0", "false")
    return tqdm(total=total, desc=what, unit="row", delay=2, leave=False, disable=off,
                smoothing=0.1)


def run_tasks(function: Callable, tasks: list[tuple], executor: Any = None, what: str = "plans",
              *, on_result: Callable[[int, Any], None] | None = None,
              weights: Sequence[int] | None = None,
              batch_key: Callable[[tuple], Any] = _task_key) -> list:
    """``[function(*task) for task in tasks]``, on ``executor`` when given.

    ``executor``: any ``concurrent.futures.Executor`` (a
    ``ProcessPoolExecutor``, ``dask.distributed.Client.get_executor()``) or a
    ``dask.distributed.Client`` (its ``submit``); tasks go in batches
    (:func:`batches`, :data:`BATCHES_PER_WORKER` per worker slot) of
    :func:`run_batch`.  ``on_result(index, result)`` runs in this thread as
    each result arrives; ``weights`` (rows per task) drive a tqdm progress bar
    (rows per second, ETA) that appears after two seconds (``TQDM_DISABLE=1``
    hides it).  A closed executor is refused before any task runs; a task the
    executor loses (a worker that died, a broken pool) is a
    :class:`KVExploreError` naming the executor and the task, raised after
    every other task has finished and been handed to ``on_result``.  A
    ``KVExploreError`` a task raises is raised as is, at the same point."""
    check_executor(executor)
    weights = list(weights) if weights is not None else [1] * len(tasks)
    results: list = [None] * len(tasks)
    with _progress(sum(weights), what) as bar:
        if executor is None:
            for i, task in enumerate(tasks):
                results[i] = function(*task)
                if on_result is not None:
                    on_result(i, results[i])
                bar.update(weights[i])
            return results
        task_batches = batches(tasks, BATCHES_PER_WORKER * worker_slots(executor), batch_key)
        done: queue.Queue = queue.Queue()
        futures = []
        for n, batch in enumerate(task_batches):
            args = (run_batch, function, [tasks[i] for i in batch])
            try:
                if is_dask_client(executor):
                    future = executor.submit(*args, pure=False)
                else:
                    future = executor.submit(*args)
            except RuntimeError as exc:  # a shut-down executor
                for f in futures:
                    f.cancel()
                raise KVExploreError(
                    f"executor={executor!r:.80} refuses tasks ({exc}); expected a running "
                    "executor or dask.distributed.Client"
                ) from None
            future.add_done_callback(lambda _f, n=n: done.put(n))
            futures.append(future)
        failure: BaseException | None = None
        try:
            for _ in task_batches:
                n = done.get()
                batch = task_batches[n]
                try:
                    values = futures[n].result()
                except KVExploreError as exc:
                    failure = failure or exc
                    continue
                except Exception as exc:  # noqa: BLE001 - the executor lost the task
                    first = tasks[batch[0]]
                    failure = failure or KVExploreError(
                        f"{what}: a batch of {len(batch)} task(s) (the first {canonical(list(first[:2]))[:120]}) "
                        f"failed on executor {executor!r:.80}: {type(exc).__name__}: {exc}; expected "
                        "every worker to finish its tasks (the rows that arrived are kept: re-run "
                        "with the same output to resume)"
                    )
                    continue
                for i, value in zip(batch, values, strict=True):
                    results[i] = value
                    if on_result is not None:
                        on_result(i, value)
                    bar.update(weights[i])
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        if failure is not None:
            raise failure
    return results


# ---------------------------------------------------------------------------
# Rows in a file
# ---------------------------------------------------------------------------


def output_format(path: str | os.PathLike, flag: str = "output") -> str:
    """``"parquet"`` or ``"csv"`` by the suffix of ``path``; else a
    :class:`KVExploreError` naming it."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise KVExploreError(
            f"{flag} {str(path)!r} has suffix {suffix or 'none'!r}; expected one of {sorted(FORMATS)}"
        )
    if FORMATS[suffix] == "parquet":
        try:
            import pyarrow  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise KVExploreError(
                f"{flag} {str(path)!r} is Parquet, which needs pyarrow; expected it installed "
                "(pip install 'kvexplore[fleet]'), or a .csv file"
            ) from None
    return FORMATS[suffix]


def check_output(path: str | os.PathLike, flag: str = "output") -> Path:
    """Refuse, touching nothing, an output file that cannot be written: an
    unknown suffix, a folder in its place, a missing or unwritable folder
    (tried by creating a temporary file there), a file that is not writable."""
    target = Path(path).expanduser()
    folder = target.parent
    why = None
    if target.is_dir():
        why = "it is a folder"
    elif not folder.is_dir():
        why = f"folder {str(folder)!r} does not exist"
    elif output_format(target, flag) and target.exists() and not os.access(target, os.W_OK):
        why = "it is not writable"
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}.", suffix=".probe"):
                pass
        except OSError as exc:
            why = f"its folder is not writable ({exc.strerror or exc})"
    if why:
        raise KVExploreError(f"{flag} {str(path)!r} cannot be written: {why}; "
                             "expected a file in a writable folder")
    return target


def row_key(row: dict, columns: Sequence[str]) -> str:
    """The identity of a row: its ``columns`` (the inputs) as canonical JSON."""
    return canonical([row.get(c) for c in columns])


def _tuples(value: Any) -> Any:
    """A cell read back: a top-level list is the tuple it was written from."""
    return tuple(value) if isinstance(value, list) else value


def _arrow_table(rows: list[dict], columns: Sequence[str]):
    import pyarrow as pa

    arrays, as_json = [], []
    for c in columns:
        values = [r.get(c) for r in rows]
        kinds = {type(v) for v in values if v is not None}
        plain = [list(v) if isinstance(v, tuple) else v for v in values]
        array = None
        if len(kinds) <= 1 and not kinds & {dict, list}:
            try:
                array = pa.array(plain)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                array = None
        if array is None:  # mixed or nested values: JSON text, decoded on reading
            as_json.append(c)
            array = pa.array([None if v is None else json.dumps(v, default=str) for v in plain],
                             type=pa.string())
        arrays.append(array)
    table = pa.table(dict(zip(columns, arrays, strict=True)))
    return table.replace_schema_metadata({"kvexplore.json_columns": json.dumps(as_json)})


def _read_parquet(path: Path) -> tuple[list[str], list[dict]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    as_json = set(json.loads(meta.get(b"kvexplore.json_columns", b"[]")))
    rows = []
    for r in table.to_pylist():
        rows.append({k: _tuples(json.loads(v) if k in as_json and v is not None else v)
                     for k, v in r.items()})
    return list(table.column_names), rows


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value if _csv_value(value) == value else repr(value)
    return repr(value)


def _csv_value(text: str) -> Any:
    if text == "":
        return None
    if text == "nan":
        return math.nan
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return value


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], []
        rows = [{c: _tuples(_csv_value(t)) for c, t in zip(header, line, strict=True)}
                for line in reader]
    return header, rows


def _write_csv(f, rows: list[dict], columns: Sequence[str]) -> None:
    import csv

    w = csv.writer(f)
    w.writerow(columns)
    for r in rows:
        w.writerow([_csv_cell(r.get(c)) for c in columns])


class RowFile:
    """A sweep's rows in ``path`` (``.parquet`` or ``.csv``), for writing as
    they come and resuming.

    The file's columns are ``columns`` and, last unless ``columns`` places it,
    :data:`RELEASE_COLUMN`: every row written carries the installed vLLM
    release (:attr:`release`, read from the package metadata without
    importing vLLM).  Opening it checks the file before any work
    (:func:`check_output`) and reads the rows already there; those the
    installed release wrote are :attr:`existing` (by :func:`row_key` of
    ``key_columns``), those of another release are kept in the file but never
    found, so their tasks run again and the file ends up holding both
    releases' rows side by side.  A file that cannot be read, or that holds
    other columns, is a :class:`KVExploreError` naming it.  A row whose
    ``key_columns`` are all missing (None) has no key: it is never in
    :attr:`existing` nor found by :meth:`find` (its task runs again), and it
    stands for itself (all its columns) when rows are merged.  :meth:`add` and
    :meth:`flush` rewrite the whole file atomically, at most every
    :data:`FLUSH_SECONDS`; :meth:`finish` writes the sweep's rows in order,
    then the rows of the file that belong to no task of this sweep under this
    release (other inputs, other releases)."""

    def __init__(self, path: str | os.PathLike, columns: Sequence[str],
                 key_columns: Sequence[str], flag: str = "output"):
        self.path = check_output(path, flag)
        self.flag = flag
        self.format = output_format(self.path, flag)
        self.columns = list(columns)
        if RELEASE_COLUMN not in self.columns:
            self.columns.append(RELEASE_COLUMN)
        self.key_columns = list(key_columns)
        #: The installed vLLM release, stamped on every row written.
        self.release = installed_release().version
        self.existing: dict[str, dict] = {}
        self._kept: dict[str, dict] = {}  # every row of the file, by identity
        self._rows: dict[str, dict] = {}
        self._last = 0.0
        if self.path.exists() and self.path.stat().st_size > 0:
            try:
                found, rows = (_read_parquet if self.format == "parquet" else _read_csv)(self.path)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is refused alike
                raise KVExploreError(
                    f"{flag} {str(path)!r} exists but cannot be read as {self.format} "
                    f"({type(exc).__name__}: {exc}); expected rows an earlier sweep wrote there, "
                    "or another path"
                ) from None
            if rows and found != self.columns:
                raise KVExploreError(
                    f"{flag} {str(path)!r} holds columns {found}; expected this sweep's "
                    f"{self.columns} (another path, or remove the file)"
                )
            for r in rows:
                self._kept[self.identity(r)] = r
                if self.keyed(r) and r.get(RELEASE_COLUMN) == self.release:
                    self.existing[row_key(r, self.key_columns)] = r
        self._rows = dict(self._kept)

    @property
    def rows(self) -> list[dict]:
        """Every row the file held when it was opened, in its order."""
        return list(self._kept.values())

    def keyed(self, row: dict) -> bool:
        """Whether ``row`` has a key: one of ``key_columns`` is not None."""
        return any(row.get(c) is not None for c in self.key_columns)

    def identity(self, row: dict) -> str:
        """Which row of the file ``row`` replaces: its :func:`row_key` and
        release, or for a row with no key, all its columns."""
        if self.keyed(row):
            return row_key(row, [*self.key_columns, RELEASE_COLUMN])
        return "\0" + row_key(row, self.columns)

    def stamped(self, row: dict) -> dict:
        """``row`` with :data:`RELEASE_COLUMN` set to :attr:`release`."""
        return {**row, RELEASE_COLUMN: self.release}

    def find(self, inputs: dict, check: Callable[[dict], bool] | None = None) -> dict | None:
        """The row of the file, written by the installed release, whose key
        columns equal ``inputs``'s and that ``check`` accepts (the key
        computed again from the row's own columns); None when there is none,
        ``check`` refuses it (a row whose cells were edited: its task runs
        again and its new row replaces it) or ``inputs`` has no key (its
        task must run)."""
        if not self.keyed(inputs):
            return None
        row = self.existing.get(row_key(inputs, self.key_columns))
        if row is not None and check is not None and not check(row):
            return None
        return row

    def add(self, rows: list[dict]) -> None:
        """Rows that arrived (stamped with :attr:`release`): kept, written at
        the next :meth:`flush`."""
        for r in rows:
            r = self.stamped(r)
            self._rows[self.identity(r)] = r
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Rewrite the file with every row so far (at most every
        :data:`FLUSH_SECONDS` unless ``force``)."""
        if not force and time.monotonic() - self._last < FLUSH_SECONDS:
            return
        self._write(list(self._rows.values()))

    def finish(self, rows: list[dict]) -> None:
        """Write ``rows`` (the sweep's, in order, stamped with
        :attr:`release`), then the file's other rows (other inputs, other
        releases)."""
        rows = [self.stamped(r) for r in rows]
        mine = {self.identity(r) for r in rows}
        self._write([*rows, *(r for k, r in self._kept.items() if k not in mine)])

    def _write(self, rows: list[dict]) -> None:
        self._last = time.monotonic()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                os.close(fd)
                pq.write_table(_arrow_table(rows, self.columns), tmp)
            else:
                with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                    _write_csv(f, rows, self.columns)
            os.replace(tmp, self.path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise KVExploreError(
                    f"{self.flag} {str(self.path)!r} cannot be written ({exc.strerror or exc}); "
                    "expected a file in a writable folder"
                ) from None
            raise


# ---------------------------------------------------------------------------
# One resumable sweep
# ---------------------------------------------------------------------------


def resumable_sweep(function: Callable, tasks: list[tuple], *, columns: Sequence[str],
                    key_column: str, questions: Sequence[Sequence[Any] | None],
                    file_keys: Sequence[Sequence[str | None]],
                    checks: Sequence[Sequence[Callable[[dict], bool] | None]],
                    executor: Any = None, output: RowFile | None = None, store: Any = None,
                    what: str = "rows", batch_key: Callable[[tuple], Any] = _task_key,
                    order: Sequence[tuple[int, int]] | None = None) -> list[list[dict]]:
    """The rows of every task (``function(*task)`` returns that task's rows,
    a list of dicts of ``columns``), in task order, each taken from the first
    place that answers it: ``output`` (a :class:`RowFile` whose key column is
    ``key_column``: a task whose every row is found by its ``file_keys`` and
    accepted by its ``checks``, the key computed again from the row's own
    cells), then ``store`` (an :class:`~kvexplore.store.AnswerStore` or None:
    a task whose every row is stored for its ``questions``, a
    :class:`~kvexplore.store.Question` per row, ``None`` for a task that
    cannot be keyed), else computed by :func:`run_tasks` on ``executor``.
    Rows computed are stored for their questions and written to ``output``
    as they arrive; at the end ``output`` holds the rows in ``order``
    (``(task, row)`` positions; default task order, :meth:`RowFile.finish`)
    and the store is pruned."""
    columns = list(columns)
    names = set(columns)

    def valid(value: Any) -> bool:
        return isinstance(value, dict) and set(value) == names

    def keyed(rows: list[dict], keys: Sequence[str | None]) -> list[dict]:
        return [{**r, key_column: k} for r, k in zip(rows, keys, strict=True)]

    results: list = [None] * len(tasks)
    pending = []
    for i in range(len(tasks)):
        if output is not None:
            found = [output.find({key_column: k}, c) if k else None
                     for k, c in zip(file_keys[i], checks[i], strict=True)]
            if found and all(r is not None for r in found):
                results[i] = [{c: r[c] for c in columns} for r in found]
                continue
        if store is not None and questions[i]:
            hits = [store.get(q, valid) for q in questions[i]]
            if all(h is not None for h in hits):
                # lists read back were tuples (a cell, as run_tasks hands it)
                results[i] = [{c: _tuples(h[c]) for c in columns} for h in hits]
                if output is not None:
                    output.add(keyed(results[i], file_keys[i]))
                continue
        pending.append(i)

    def arrived(n: int, rows: list[dict]) -> None:
        i = pending[n]
        results[i] = rows
        if store is not None and questions[i]:
            for q, r in zip(questions[i], rows, strict=True):
                store.put(q, r)
        if output is not None:
            output.add(keyed(rows, file_keys[i]))

    try:
        run_tasks(function, [tasks[i] for i in pending], executor, what=what,
                   on_result=arrived, weights=[len(file_keys[i]) for i in pending],
                   batch_key=batch_key)
    finally:
        if output is not None:
            output.flush(force=True)
    if output is not None:
        if order is None:
            order = [(i, j) for i in range(len(tasks)) for j in range(len(file_keys[i]))]
        output.finish([{**results[i][j], key_column: file_keys[i][j]} for i, j in order])
    if store is not None:
        store.prune()
    return results


__all__ = [
    "BATCHES_PER_WORKER",
    "FLUSH_SECONDS",
    "FORMATS",
    "RELEASE_COLUMN",
    "RowFile",
    "batches",
    "check_executor",
    "check_output",
    "is_dask_client",
    "output_format",
    "resumable_sweep",
    "row_key",
    "run_batch",
    "run_tasks",
    "worker_slots",
]
