"""One Python environment per vLLM release, for answers from releases other
than the installed one.

A plan runs the code of the vLLM installed beside kvexplore.  To answer for
another release of the window, kvexplore runs in that release's own
environment: :func:`environment` creates it on first use with ``uv`` (a real
environment manager that shares installed packages between environments
through its cache) under :func:`environments_dir`, and returns its Python.

An environment holds ``vllm==<release>`` with the release's own requirements,
and kvexplore's runtime and test requirements (:data:`PACKAGES`); kvexplore
itself is the running copy, put on the child's ``PYTHONPATH``
(:func:`run_in`).  :data:`OVERRIDES` lists the one requirement a release pins
that the package index does not serve, with the release kvexplore installs
instead and why.  An environment is created in a temporary folder and renamed
into place only when it passes :func:`check_environment`, so a failed or
interrupted install leaves nothing half-created.

Every environment is checked before it runs anything
(:func:`check_environment`: its Python starts, its vLLM's package metadata is
the release it is filed under and is the ``vllm`` module it imports, it holds
:data:`PACKAGES`, and it imports this kvexplore); one that fails is refused
naming its folder and the fix (``kvexplore envs R --repair``), which rebuilds
it the same way and swaps it in.

>>> environment_path("0.34.0").name
'vllm-0.34.0'
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from kvexplore.errors import KVExploreError
from kvexplore.paths import cache_dir, cache_folder
from kvexplore.planning.release import (
    INSTALL_OVERRIDES,
    REQUIREMENT,
    WINDOW_RELEASES,
    canonical_release,
)

#: What every release environment holds besides vLLM: kvexplore's runtime
#: requirements and what its per-release tests run with.
PACKAGES = ("pandas>=2", "matplotlib>=3.8", "ipywidgets>=8", "pytest>=8", "hypothesis>=6")

#: Requirements a release pins that the package index does not serve, and what
#: is installed instead (kept with the release adapter).
OVERRIDES = INSTALL_OVERRIDES

#: Seconds one environment's install may take before it is abandoned.
INSTALL_TIMEOUT_S = 1800


#: The folder of the environments inside kvexplore's cache folder.
ENVS = "envs"


def environments_dir() -> Path:
    """``kvexplore.paths.cache_dir() / "envs"`` (by default
    ``~/.cache/kvexplore/envs``; ``$KVEXPLORE_CACHE_DIR`` moves it)."""
    return cache_dir() / ENVS


def environment_path(version: str) -> Path:
    """Where the environment of vLLM ``version`` lives (whether or not it
    exists), named by the release's one spelling
    (:func:`~kvexplore.planning.release.canonical_release`: ``"0.34"`` and
    ``"v0.34.0"`` are ``vllm-0.34.0``)."""
    return environments_dir() / f"vllm-{canonical_release(version)}"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


#: Seconds the check of one environment may take (it starts one Python that
#: reads package metadata and imports nothing).
CHECK_TIMEOUT_S = 60

#: What the check runs in the environment's Python: its vLLM's metadata
#: (version, and the ``vllm/__init__.py`` that distribution installed), where
#: ``vllm`` and ``kvexplore`` would be imported from (found, not imported),
#: and which of the distributions named in ``argv`` are not installed.
_CHECK_CODE = """\
import importlib.metadata as m, importlib.util as u, json, sys
out = {"python": sys.version.split()[0], "vllm": None, "vllm_files": None}
try:
    d = m.distribution("vllm")
    out["vllm"], out["vllm_files"] = d.version, str(d.locate_file("vllm/__init__.py"))
except m.PackageNotFoundError:
    pass
for name in ("vllm", "kvexplore"):
    spec = u.find_spec(name)
    out[name + "_module"] = spec.origin if spec is not None else None
missing = []
for name in sys.argv[1:]:
    try:
        m.version(name)
    except m.PackageNotFoundError:
        missing.append(name)
out["missing"] = missing
print(json.dumps(out))
"""


def _package() -> Path:
    """This kvexplore package's folder (what a release environment imports)."""
    return Path(__file__).resolve().parents[1]


def _same_file(a: str | None, b: str | os.PathLike) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def _problems(env: Path, version: str) -> list[str]:
    """What is wrong with the environment at ``env`` for vLLM ``version``
    (empty when nothing is): one run of its Python, with this kvexplore on its
    path as :func:`run_in` puts it."""
    python = _python(env)
    if not python.is_file():
        return [f"{python} is missing"]
    if not os.access(python, os.X_OK):
        return [f"{python} is not executable"]
    distributions = [Requirement(r).name for r in PACKAGES]
    try:
        out = subprocess.run(
            [str(python), "-c", _CHECK_CODE, *distributions],
            capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False,
            env=child_environment(), cwd=env,
        )
    except subprocess.TimeoutExpired:
        return [f"{python} did not answer within {CHECK_TIMEOUT_S} s"]
    except OSError as exc:
        return [f"{python} does not run ({type(exc).__name__}: {exc.strerror or exc})"]
    lines = out.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if out.returncode == 0 and lines else None
    except ValueError:
        facts = None
    if not isinstance(facts, dict) or not isinstance(facts.get("missing"), list):
        said = " ".join((out.stderr or out.stdout).split())[-300:]
        return [f"{python} does not run Python's package checks (exit {out.returncode}"
                f"{': ' + said if said else ''})"]
    problems = []
    got = facts.get("vllm")
    if got is None:
        problems.append("it has no vllm installed")
    elif got != version:
        problems.append(f"its vllm is {got} (package metadata), not {version}")
    elif not _same_file(facts.get("vllm_module"), facts.get("vllm_files") or ""):
        problems.append(f"it imports vllm from {facts.get('vllm_module')}, not from the "
                        f"vllm {got} its metadata installed ({facts.get('vllm_files')})")
    if facts["missing"]:
        problems.append(f"it lacks {', '.join(facts['missing'])}")
    if not _same_file(facts.get("kvexplore_module"), _package() / "__init__.py"):
        problems.append(f"it imports kvexplore from {facts.get('kvexplore_module')}, not "
                        f"from {_package()}")
    return problems


def check_environment(version: str) -> Path:
    """The Python of vLLM ``version``'s environment, once it has proved what
    it is: one run of that Python (which reads package metadata and imports
    nothing) shows that it starts, that its ``vllm`` distribution is release
    ``version`` and is the ``vllm`` module it imports, that it holds
    :data:`PACKAGES`, and that it imports this kvexplore when run as
    :func:`run_in` runs it.

    Refused with a :class:`KVExploreError` naming the folder, what is wrong
    and the fix (``kvexplore envs R --repair``): a missing, non-executable or
    failing ``bin/python``, another vLLM release or none, a missing package,
    another kvexplore; and a release outside the window."""
    version = canonical_release(version)
    env = environment_path(version)
    problems = _problems(env, version)
    if problems:
        raise _unusable(env, version, problems)
    return _python(env)


def environment_problems(version: str) -> tuple[str, ...]:
    """What :func:`check_environment` finds wrong with vLLM ``version``'s
    environment, one phrase each: empty when it can be used, ``("missing",)``
    when there is none."""
    version = canonical_release(version)
    env = environment_path(version)
    if not env.exists():
        return ("missing",)
    return tuple(_problems(env, version))


def _unusable(env: Path, version: str, problems: Sequence[str]) -> KVExploreError:
    return KVExploreError(
        f"the vLLM {version} environment at {env} cannot be used: "
        f"{'; '.join(problems)}; expected vLLM {version} with {', '.join(PACKAGES)} "
        f"and this kvexplore; rebuild it with `kvexplore envs {version} --repair` "
        f"(kvexplore.environment({version!r}, repair=True))"
    )


def existing_environments() -> dict[str, Path]:
    """``{release: python}`` of every environment already created, window order."""
    out = {}
    for version in WINDOW_RELEASES:
        python = _python(environment_path(version))
        if python.exists():
            out[version] = python
    return out


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        candidate = Path(sys.executable).with_name("uv")
        uv = str(candidate) if candidate.exists() else None
    if uv is None:
        raise KVExploreError(
            "creating a vLLM release environment needs uv, which is not installed; "
            "expected `uv` on PATH (pip install uv)"
        )
    return uv


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One creator at a time per environments folder (other processes wait)."""
    cache_folder(ENVS)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], what: str) -> None:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True,
                             timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise KVExploreError(f"{what} took over {INSTALL_TIMEOUT_S} s and was stopped") from None
    if out.returncode != 0:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-12:])
        raise KVExploreError(f"{what} failed (exit {out.returncode}):\n{tail}")


def environment(version: str, *, create: bool = True, repair: bool = False) -> Path:
    """The Python of vLLM ``version``'s environment, checked
    (:func:`check_environment`) before it is returned; created with ``uv``
    when missing and ``create`` is true; rebuilt when it fails the check and
    ``repair`` is true.

    A creation or rebuild installs into a temporary folder beside it and
    renames it into place only once it passes the check (a rebuild then
    removes the old folder), so a failed or interrupted install leaves the
    folder as it was.  Refused with a :class:`KVExploreError`: a release
    outside the window, a missing environment with ``create=False``, one that
    fails the check without ``repair`` (naming its folder, what is wrong and
    the fix), an install that fails or cannot reach a package index (uv's
    message quoted), a cache folder that cannot be written.  ``version`` is
    spelled as :func:`~kvexplore.planning.release.canonical_release` spells
    it before any folder is made or install runs."""
    version = canonical_release(version)
    env = environment_path(version)
    python = _python(env)
    if env.exists():
        problems = _problems(env, version)
        if not problems:
            return python
        if not repair:
            raise _unusable(env, version, problems)
    elif not create:
        raise KVExploreError(
            f"no environment for vLLM {version} at {env}; expected one made by "
            f"kvexplore.environment({version!r}) or `kvexplore envs {version} --create`"
        )
    with _locked(env.parent):
        if env.exists() and not _problems(env, version):  # made or mended meanwhile
            return python
        uv = _uv()
        tmp = Path(tempfile.mkdtemp(prefix=f".vllm-{version}-", dir=env.parent))
        try:
            _run([uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, str(tmp)],
                 f"creating the vLLM {version} environment (uv venv)")
            cmd = [uv, "pip", "install", "--quiet", "--python", str(_python(tmp)),
                   f"vllm=={version}", *PACKAGES]
            overrides = OVERRIDES.get(version, ())
            if overrides:
                override_file = tmp / "overrides.txt"
                override_file.write_text("\n".join(overrides) + "\n")
                cmd += ["--override", str(override_file)]
            _run(cmd, f"installing vllm=={version} into {tmp} (uv pip install)")
            problems = _problems(tmp, version)
            if problems:
                raise KVExploreError(
                    f"the environment made for vLLM {version} at {tmp} cannot be used: "
                    f"{'; '.join(problems)}; expected vLLM {version}"
                )
            _swap_in(tmp, env)  # a relocatable venv names no folder of its own
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return python


def _swap_in(new: Path, env: Path) -> None:
    """``new`` renamed to ``env``; an ``env`` already there is renamed aside
    first and removed after."""
    if not (env.exists() or env.is_symlink()):
        os.rename(new, env)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{env.name}-old-", dir=env.parent))
    os.rename(env, aside / env.name)
    try:
        os.rename(new, env)
    except BaseException:
        os.rename(aside / env.name, env)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def child_environment(version: str | None = None) -> dict[str, str]:
    """``os.environ`` for a child run in a release environment: this copy of
    kvexplore first on ``PYTHONPATH`` (through a folder that holds only it)
    and, with ``version``, vLLM's cache root inside that release's environment
    (releases inspect model classes into files of the same names, so a shared
    cache makes each release redo the other's).  A child only plans and never
    runs a GPU kernel, so ``HUMMING_DISABLE_PARALLEL_BUILD`` is ``1`` unless
    set already: vLLM's dependency humming-kernels then starts no background
    processes building its NVRTC binary and kernel launcher at import
    (``humming/ops/utils.py``)."""
    package = _package()
    link_dir = cache_folder(ENVS, ".kvexplore-path")
    link = link_dir / hashlib.sha256(str(package).encode()).hexdigest()[:16]
    target = link / "kvexplore"
    if not target.exists() or target.resolve() != package:
        link.mkdir(exist_ok=True)
        staged = link / f".kvexplore.{os.getpid()}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(package, target_is_directory=True)
        os.replace(staged, target)  # atomic, also over a stale link
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(link), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    if version is not None:  # environment_path spells the release canonically
        env["VLLM_CACHE_ROOT"] = str(environment_path(version) / "vllm-cache")
    return env


def run_in(version: str, args: Sequence[str], *, timeout: float | None = None,
           cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``python args...`` in vLLM ``version``'s environment (created if
    missing, refused if it fails :func:`check_environment`), with this
    kvexplore importable; output captured as text."""
    python = environment(version)
    return subprocess.run([str(python), *args], capture_output=True, text=True,
                          timeout=timeout, env=child_environment(version), cwd=cwd, check=False)


def model_argument(model: Any) -> Any:
    """``model`` as JSON data another process can plan from (an id or path
    string, or a config dict)."""
    from kvexplore.planning.models import ModelSource

    if isinstance(model, ModelSource):
        return dict(model.config)
    if isinstance(model, str | Mapping):
        return model if isinstance(model, str) else dict(model)
    from kvexplore.planning.models import load_model_config

    return dict(load_model_config(model).config)


#: Seconds a release worker waits for its next question before it exits
#: (``KVEXPLORE_WORKER_IDLE_S`` overrides it); the next question starts a new one.
WORKER_IDLE_S = 600.0
#: Seconds a new worker has to start (its Python, kvexplore's import) and say
#: which release and code it runs.
WORKER_START_S = 120.0


def idle_seconds() -> float:
    """Seconds a worker waits for its next question before it exits:
    ``KVEXPLORE_WORKER_IDLE_S`` where it is a number, else :data:`WORKER_IDLE_S`."""
    try:
        return float(os.environ.get("KVEXPLORE_WORKER_IDLE_S", WORKER_IDLE_S))
    except ValueError:
        return WORKER_IDLE_S


class _WorkerDied(Exception):
    """The worker's process ended before it answered."""


#: Every :class:`LineWorker` made in this process (ended at exit).
_LIVE: weakref.WeakSet = weakref.WeakSet()


class LineWorker:
    """One long-lived child process that answers questions over a pipe: one
    JSON object per line each way.

    The child's first line is its hello (:meth:`_check_hello` refuses a wrong
    one); each question is one line and each answer one line.  The process
    starts on the first question, exits at the end of its input (this process
    closed it or died) and after :func:`idle_seconds` without a question (the
    next question starts a new one).  A worker that ends before answering is
    restarted once and refused with its last lines if it ends again.  Its
    stderr goes to an unlinked temporary file, quoted when it fails, so
    nothing is left behind.  Subclasses give the command (:meth:`_command`),
    how errors name the worker (``where``), and what an answer must hold
    (:meth:`_answer`)."""

    where = "the worker"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._log = None
        _LIVE.add(self)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        """The worker's command line and environment."""
        raise NotImplementedError

    def _check_hello(self, hello: dict) -> None:
        """Refuse (closing the worker) a first line that names another worker."""

    def _answer(self, reply: dict, question: dict, timeout: float) -> Any:
        """What an ``{"ok": true}`` reply answers."""
        return reply["answer"]

    # -- the process ---------------------------------------------------------
    def _start(self) -> None:
        argv, env = self._command()
        self._log = tempfile.TemporaryFile(mode="w+b")
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, env=env)
        self._check_hello(self._read(WORKER_START_S))

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def last_lines(self) -> str:
        """The last lines the worker wrote to its stderr (up to 600 characters)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        return " ".join(text.strip().splitlines()[-3:])[-600:]

    def _read(self, timeout: float) -> dict:
        """The worker's next line as JSON; :class:`_WorkerDied` at its end."""
        out = self._proc.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            self.close()
            raise KVExploreError(
                f"{self.where} did not answer within {timeout:.0f} s; expected an answer "
                "(its worker was stopped)")
        line = out.readline()
        if not line:
            raise _WorkerDied(self.last_lines())
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            self.close()
            raise KVExploreError(
                f"{self.where} could not answer: it printed {line[:200]!r}; expected one JSON "
                "object per line")
        return value

    def end_input(self) -> None:
        """Close the worker's input: it exits once it reads the end
        (:meth:`close` then waits for it)."""
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def close(self) -> None:
        """End the worker (its input closed, then killed after 5 s)."""
        self.end_input()
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(OSError):
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs, else None."""
        return self._proc.pid if self._alive() else None

    # -- a question ------------------------------------------------------------
    def _ask_once(self, question: dict, timeout: float) -> Any:
        if not self._alive():
            self.close()  # exited when idle: a new one
            self._start()
        self._proc.stdin.write((json.dumps(question) + "\n").encode())
        self._proc.stdin.flush()
        reply = self._read(timeout)
        if not reply.get("ok"):
            raise KVExploreError(
                f"{self.where} could not answer: {str(reply.get('error'))[-600:]}")
        return self._answer(reply, question, timeout)

    def request(self, question: dict, *, timeout: float = 1800) -> Any:
        """The answer to ``question`` (a JSON object), from this worker,
        started on first use; a worker that dies is restarted once, and one
        that dies again is refused with its last lines."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._ask_once(question, timeout)
                except (_WorkerDied, BrokenPipeError) as exc:
                    tail = str(exc) or self.last_lines()
                    self.close()
                    if attempt == 2:
                        raise KVExploreError(
                            f"{self.where} could not answer: its worker ended twice; "
                            f"{tail}") from None
        raise AssertionError("unreachable")


class ReleaseWorker(LineWorker):
    """One long-lived Python in vLLM ``version``'s environment that answers
    many questions over a pipe, keeping vLLM imported and its builds and
    plans cached between them (:func:`serve` is its loop; the process's life
    is :class:`LineWorker`'s).

    Protocol: the worker first says ``{"vllm": its release, "code": its
    kvexplore code_version}``; each question ``{"module": M, "argument": A}``
    is answered with ``{"ok": true, "answer": ..., "vllm": ..., "code": ...}``
    (what ``python -m M A`` prints as its last line) or ``{"ok": false,
    "error": ...}``.  A worker of another release is refused; one whose
    kvexplore code changed since it started is replaced by a new one."""

    def __init__(self, version: str) -> None:
        self.version = canonical_release(version)
        self.env = environment_path(self.version)
        self.where = f"vLLM {self.version} (the environment at {self.env})"
        super().__init__()

    def _command(self) -> tuple[list[str], dict[str, str]]:
        python = environment(self.version)
        return ([str(python), "-m", "kvexplore.versions.environments", "serve"],
                child_environment(self.version))

    def _check_hello(self, hello: dict) -> None:
        from kvexplore.store import code_version

        if hello.get("vllm") != self.version:
            self.close()
            raise _unusable(self.env, self.version, [f"it answered as vLLM {hello.get('vllm')}"])
        if hello.get("code") != code_version():
            self.close()
            raise KVExploreError(
                f"vLLM {self.version}'s worker (the environment at {self.env}) imports another "
                f"kvexplore ({hello.get('code')}; this one is {code_version()}); expected this "
                f"copy first on its PYTHONPATH (`kvexplore envs {self.version} --repair`)")

    def _answer(self, reply: dict, question: dict, timeout: float) -> Any:
        from kvexplore.store import code_version

        if reply.get("vllm") != self.version:
            self.close()
            raise _unusable(self.env, self.version, [f"it answered as vLLM {reply.get('vllm')}"])
        if reply.get("code") != code_version():
            self.close()  # kvexplore changed since the worker started: ask a new one
            return self._ask_once(question, timeout)
        return reply["answer"]

    def ask(self, module: str, argument: str, *, timeout: float = 1800) -> dict:
        """``python -m module argument``'s answer (the JSON object it prints
        last), from this release's worker (:meth:`LineWorker.request`)."""
        return self.request({"module": module, "argument": argument}, timeout=timeout)


_WORKERS: dict[tuple[str, str], ReleaseWorker] = {}
_WORKERS_LOCK = threading.Lock()


def release_worker(version: str) -> ReleaseWorker:
    """The :class:`ReleaseWorker` of ``version`` for this process (one per
    release and environment folder, so another cache folder has its own; its
    process starts on its first question)."""
    version = canonical_release(version)
    key = (version, str(environment_path(version)))
    with _WORKERS_LOCK:
        if key not in _WORKERS:
            _WORKERS[key] = ReleaseWorker(version)
        return _WORKERS[key]


@atexit.register
def close_workers() -> None:
    """End every worker of this process (:class:`LineWorker`: the release
    workers and any other); also run at exit."""
    workers = list(_LIVE)
    for w in workers:  # all at once: each exits while the others do
        w.end_input()
    for w in workers:
        w.close()


def answer_in(version: str, module: str, request: str, *, timeout: float = 1800) -> dict:
    """``python -m module request``'s answer in vLLM ``version``'s
    environment: the JSON object with a ``"vllm"`` entry naming the release
    that answered, asked of the release's long-lived worker
    (:func:`release_worker`), which keeps vLLM imported and its builds
    between questions.

    Refused with a :class:`KVExploreError` naming the environment's folder:
    an environment that fails :func:`check_environment`, a question that
    fails (its last lines quoted), a worker that ends twice, and an answer
    from another release than ``version`` (with the fix, ``kvexplore envs R
    --repair``)."""
    version = canonical_release(version)
    answer = release_worker(version).ask(module, request, timeout=timeout)
    if not isinstance(answer, dict) or answer.get("vllm") != version:
        got = answer.get("vllm") if isinstance(answer, dict) else answer
        raise _unusable(environment_path(version), version, [f"it answered as vLLM {got}"])
    return answer


def serve() -> None:
    """A release worker's loop (``python -m kvexplore.versions.environments
    serve``): say the release and code, then answer each question line
    (:class:`ReleaseWorker`) until the input ends or stays idle for
    :func:`idle_seconds`.  Whatever else writes to the standard output
    (vLLM's logs) goes to the standard error, so the pipe holds only
    answers."""
    import importlib
    import importlib.metadata
    import traceback

    from kvexplore.store import code_version

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    release = importlib.metadata.version("vllm")
    code = code_version()

    def say(value: dict) -> None:
        answers.write(json.dumps(value, default=str) + "\n")
        answers.flush()

    say({"vllm": release, "code": code})
    idle = idle_seconds()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], idle)
        if not ready:
            return
        line = sys.stdin.readline()
        if not line:
            return
        try:
            question = json.loads(line)
            # a real file: vLLM's suppress_stdout asks sys.stdout for its fileno
            with tempfile.TemporaryFile("w+") as printed:
                with contextlib.redirect_stdout(printed):
                    importlib.import_module(question["module"]).main([question["argument"]])
                printed.seek(0)
                lines = printed.read().strip().splitlines()
            say({"ok": True, "answer": json.loads(lines[-1]), "vllm": release, "code": code})
        except Exception:  # the question's error, quoted to the asker
            say({"ok": False, "error": " ".join(
                traceback.format_exc().strip().splitlines()[-3:]), "vllm": release})


__all__ = [
    "LineWorker",
    "ReleaseWorker",
    "close_workers",
    "release_worker",
    "OVERRIDES",
    "PACKAGES",
    "REQUIREMENT",
    "answer_in",
    "check_environment",
    "child_environment",
    "environment",
    "environment_path",
    "environment_problems",
    "environments_dir",
    "existing_environments",
    "idle_seconds",
    "model_argument",
    "run_in",
]


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
    # the worker's exit: its closing garbage collections would only scan
    # what the exit frees anyway
    import gc

    gc.freeze()
