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
into place only when its ``vllm`` imports with the expected version, so a
failed or interrupted install leaves nothing half-created.

>>> environment_path("0.34.0").name
'vllm-0.34.0'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvexplore.errors import KVExploreError
from kvexplore.paths import cache_dir
from kvexplore.planning.release import (
    REQUIREMENT,
    WINDOW_RELEASES,
    canonical_release,
)

#: What every release environment holds besides vLLM: kvexplore's runtime
#: requirements and what its per-release tests run with.
PACKAGES = ("pandas>=2", "matplotlib>=3.8", "ipywidgets>=8", "pytest>=8", "hypothesis>=6")

#: Requirements a release pins that the package index does not serve, with the
#: release installed instead.  vLLM 0.34.0 pins ``flashinfer-python==0.7.3``,
#: which is not published; kvexplore never runs a FlashInfer kernel (it imports
#: the package only where vLLM does at configuration time), so the 0.34.0
#: environment takes 0.7.2.post1, the release vLLM 0.33.0 pins.
OVERRIDES: dict[str, tuple[str, ...]] = {
    "0.34.0": ("flashinfer-python==0.7.2.post1",),
}

#: Seconds one environment's install may take before it is abandoned.
INSTALL_TIMEOUT_S = 1800


def environments_dir() -> Path:
    """``kvexplore.paths.cache_dir() / "envs"`` (by default
    ``~/.cache/kvexplore/envs``; ``$KVEXPLORE_CACHE_DIR`` moves it)."""
    return cache_dir() / "envs"


def environment_path(version: str) -> Path:
    """Where the environment of vLLM ``version`` lives (whether or not it
    exists), named by the release's one spelling
    (:func:`~kvexplore.planning.release.canonical_release`: ``"0.34"`` and
    ``"v0.34.0"`` are ``vllm-0.34.0``)."""
    return environments_dir() / f"vllm-{canonical_release(version)}"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _installed_version(python: Path) -> str | None:
    """The vLLM version ``python`` has installed, from its metadata, or None."""
    try:
        out = subprocess.run(
            [str(python), "-c",
             "import importlib.metadata as m; print(m.version('vllm'))"],
            capture_output=True, text=True, timeout=120, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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
    folder.mkdir(parents=True, exist_ok=True)
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


def environment(version: str, *, create: bool = True) -> Path:
    """The Python of vLLM ``version``'s environment, created with ``uv`` when
    missing and ``create`` is true.

    Refused with a :class:`KVExploreError`: a release outside the window, a
    missing environment with ``create=False``, an install that fails or cannot
    reach a package index (uv's message quoted).  A failed creation removes
    its temporary folder.  ``version`` is spelled as
    :func:`~kvexplore.planning.release.canonical_release` spells it before any
    folder is made or install runs."""
    version = canonical_release(version)
    env = environment_path(version)
    python = _python(env)
    if python.exists():
        return python
    if not create:
        raise KVExploreError(
            f"no environment for vLLM {version} at {env}; expected one made by "
            f"kvexplore.environment({version!r}) or `kvexplore envs {version}`"
        )
    uv = _uv()
    with _locked(env.parent):
        if python.exists():  # another process made it meanwhile
            return python
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
            got = _installed_version(_python(tmp))
            if got != version:
                raise KVExploreError(
                    f"the environment made for vLLM {version} has vLLM {got}; expected {version}"
                )
            os.replace(tmp, env)  # a relocatable venv names no folder of its own
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if not _python(env).exists():
                shutil.rmtree(env, ignore_errors=True)
            raise
    return python


def child_environment(version: str | None = None) -> dict[str, str]:
    """``os.environ`` for a child run in a release environment: this copy of
    kvexplore first on ``PYTHONPATH`` (through a folder that holds only it)
    and, with ``version``, vLLM's cache root inside that release's environment
    (releases inspect model classes into files of the same names, so a shared
    cache makes each release redo the other's)."""
    package = Path(__file__).resolve().parents[1]  # the kvexplore package
    link_dir = environments_dir() / ".kvexplore-path"
    link_dir.mkdir(parents=True, exist_ok=True)
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
    if version is not None:  # environment_path spells the release canonically
        env["VLLM_CACHE_ROOT"] = str(environment_path(version) / "vllm-cache")
    return env


def run_in(version: str, args: Sequence[str], *, timeout: float | None = None,
           cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``python args...`` in vLLM ``version``'s environment (created if
    missing), with this kvexplore importable; output captured as text."""
    python = environment(version)
    return subprocess.run([str(python), *args], capture_output=True, text=True,
                          timeout=timeout, env=child_environment(version), cwd=cwd, check=False)


__all__ = [
    "OVERRIDES",
    "PACKAGES",
    "REQUIREMENT",
    "child_environment",
    "environment",
    "environment_path",
    "environments_dir",
    "existing_environments",
    "run_in",
]
