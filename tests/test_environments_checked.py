"""A release environment proves what it is before it answers.

Broken environments are placed by hand in a temporary cache folder, as a
hostile user would leave them: a ``bin/python`` that runs another vLLM
release, one that is not executable, a venv without vLLM, one that imports
another kvexplore, one that passes the check but answers as another release.
Nothing is downloaded: a rebuild runs a stand-in ``uv`` placed first on
``PATH`` that makes a venv over this Python's packages (vLLM 0.33.0).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvexplore
from kvexplore.cli import main
from kvexplore.errors import KVExploreError
from kvexplore.versions import (
    check_environment,
    compare_versions,
    environment,
    environment_problems,
)

INSTALLED = importlib.metadata.version("vllm")
OTHER = "0.34.0" if INSTALLED != "0.34.0" else "0.32.0"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and ``uv`` a stand-in that fails."""
    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text("#!/bin/sh\necho 'uv: offline' >&2\nexit 1\n")
    uv.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "cache"


def _venv(folder: Path, *, system_packages: bool) -> Path:
    """A real venv (no pip) at ``folder``; with ``system_packages`` it sees
    this Python's packages, vLLM included."""
    args = [sys.executable, "-m", "venv", "--without-pip", str(folder)]
    if system_packages:
        args.insert(3, "--system-site-packages")
    subprocess.run(args, check=True)
    return folder / "bin" / "python"


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + textwrap.dedent(text))
    path.chmod(0o755)
    return path


def _refusal(release: str) -> str:
    with pytest.raises(KVExploreError) as info:
        environment(release, create=False)
    return str(info.value)


def test_an_environment_running_another_release_is_refused(cache):
    """The issue's silent wrong answer: vllm-OTHER whose python runs INSTALLED."""
    folder = cache / "envs" / f"vllm-{OTHER}"
    _script(folder / "bin" / "python", f'exec {sys.executable} "$@"\n')
    text = _refusal(OTHER)
    assert str(folder) in text
    assert f"its vllm is {INSTALLED} (package metadata), not {OTHER}" in text
    assert f"`kvexplore envs {OTHER} --repair`" in text
    with pytest.raises(KVExploreError, match=f"its vllm is {INSTALLED}"):
        compare_versions("Qwen/Qwen3.5-0.8B", vllm=[OTHER, "0.31.0"], gpu="A100")


def test_a_python_printing_another_version_is_refused(cache):
    folder = cache / "envs" / f"vllm-{OTHER}"
    _script(folder / "bin" / "python", f"echo {OTHER}\n")
    text = _refusal(OTHER)
    assert str(folder) in text and "does not run Python's package checks" in text


def test_a_non_executable_python_is_refused_on_one_line(cache, capsys):
    python = _venv(cache / "envs" / f"vllm-{OTHER}", system_packages=True)
    python.unlink()
    python.write_text("#!/bin/sh\n")
    python.chmod(0o644)
    assert f"{python} is not executable" in _refusal(OTHER)
    assert main(["versions", "Qwen/Qwen3.5-0.8B", "--vllm", f"{OTHER},0.31.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PermissionError" not in err
    assert f"{python} is not executable" in err and "--repair" in err


def test_a_venv_without_vllm_is_refused(cache):
    _venv(cache / "envs" / "vllm-0.31.0", system_packages=False)
    text = _refusal("0.31")
    assert "it has no vllm installed" in text and "it lacks pandas" in text
    assert environment_problems("0.31.0")[0] == "it has no vllm installed"


def test_an_environment_importing_another_kvexplore_is_refused(cache, tmp_path):
    other = tmp_path / "elsewhere" / "kvexplore"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    folder = cache / "envs" / f"vllm-{INSTALLED}"
    _script(
        folder / "bin" / "python",
        f'PYTHONPATH={other.parent} exec {sys.executable} "$@"\n',
    )
    text = _refusal(INSTALLED)
    assert f"it imports kvexplore from {other / '__init__.py'}" in text
    assert str(Path(kvexplore.__file__).parent) in text


def test_a_sound_environment_is_used(cache):
    """A venv over this Python's packages is the installed release, with this
    kvexplore on its path: the check passes, and it runs this kvexplore."""
    python = _venv(cache / "envs" / f"vllm-{INSTALLED}", system_packages=True)
    assert environment_problems(INSTALLED) == ()
    assert (
        check_environment(INSTALLED) == python == environment(INSTALLED, create=False)
    )
    out = kvexplore.versions.run_in(
        INSTALLED, ["-c", "import kvexplore; print(kvexplore.__file__)"]
    )
    assert Path(out.stdout.strip()).resolve() == Path(kvexplore.__file__).resolve()


def test_an_answer_from_another_release_is_refused(cache, tmp_path):
    """An environment that passes the check (its metadata and module say OTHER)
    but whose answer names another release: compare_versions refuses it."""
    fake = tmp_path / "fake-site"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    info = fake / f"vllm-{OTHER}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {OTHER}\n"
    )
    answer = json.dumps({"vllm": INSTALLED})
    folder = cache / "envs" / f"vllm-{OTHER}"
    _script(
        folder / "bin" / "python",
        f"""\
        if [ "$1" = "-m" ]; then echo '{answer}'; exit 0; fi
        PYTHONPATH="$PYTHONPATH:{fake}" exec {sys.executable} "$@"
        """,
    )
    assert environment_problems(OTHER) == ()
    with pytest.raises(KVExploreError) as info_:
        compare_versions("Qwen/Qwen3.5-0.8B", vllm=[OTHER, "0.31.0"], gpu="A100")
    text = str(info_.value)
    assert f"it answered as vLLM {INSTALLED}" in text and str(folder) in text


def _working_uv(cache) -> None:
    """``uv`` a stand-in: ``uv venv ... DIR`` makes a venv over this Python's
    packages, ``uv pip install`` does nothing."""
    uv = Path(os.environ["PATH"].split(os.pathsep)[0]) / "uv"
    uv.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "venv" ]; then
          for last; do :; done
          rm -rf "$last"
          exec {sys.executable} -m venv --system-site-packages --without-pip "$last"
        fi
        exit 0
        """)
    )


def test_repair_rebuilds_a_broken_environment_and_swaps_it_in(cache, capsys):
    folder = cache / "envs" / f"vllm-{INSTALLED}"
    _script(folder / "bin" / "python", "exit 3\n")
    (folder / "left-behind").write_text("")
    assert main(["envs", INSTALLED, "--json"]) == 0  # listed, not repaired
    row = json.loads(capsys.readouterr().out)[0]
    assert "does not run Python's package checks (exit 3" in row["problems"]
    assert (
        main(["envs", INSTALLED, "--repair"]) == 2
    )  # uv fails: the folder is as it was
    assert "uv: offline" in capsys.readouterr().err
    assert (folder / "left-behind").exists()
    assert (
        sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(".vllm"))
        == []
    )
    _working_uv(cache)
    assert main(["envs", INSTALLED, "--repair", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["problems"] == "" and row["exists"]
    assert not (folder / "left-behind").exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [
        ".kvexplore-path",
        ".lock",
        f"vllm-{INSTALLED}",
    ]


def test_create_rebuilds_a_broken_environment(cache, capsys):
    folder = cache / "envs" / f"vllm-{INSTALLED}"
    _script(folder / "bin" / "python", "exit 3\n")
    _working_uv(cache)
    assert main(["envs", INSTALLED, "--create", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["problems"] == ""
    assert environment_problems(INSTALLED) == ()


def test_release_children_start_no_humming_build_helpers(cache, monkeypatch):
    """A child in a release environment plans and never runs a GPU kernel:
    importing vLLM's humming-kernels there starts no background build
    process; a value the user set is kept."""
    from kvexplore.versions.environments import child_environment

    monkeypatch.delenv("HUMMING_DISABLE_PARALLEL_BUILD", raising=False)
    env = child_environment()
    assert env["HUMMING_DISABLE_PARALLEL_BUILD"] == "1"
    code = ("import psutil, humming.ops.utils; "
            "print(len(psutil.Process().children(recursive=True)))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0"
    monkeypatch.setenv("HUMMING_DISABLE_PARALLEL_BUILD", "0")
    assert child_environment()["HUMMING_DISABLE_PARALLEL_BUILD"] == "0"
