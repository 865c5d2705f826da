"""pyproject.toml and environment.yml pin the same stack; CI runs the README command."""

import re
import tomllib
from pathlib import Path

import yaml

from kvexplore.planning.release import REQUIREMENT

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower()


def test_environment_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): r for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    have = {_name(r): r for r in pip if not r.startswith("-e")}
    # playwright only serves the browser test, which the test script installs
    wanted.pop("playwright", None)
    assert have == wanted
    assert wanted["vllm"] == REQUIREMENT
    assert "python=3.11" in env["dependencies"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in readme
    assert ci.strip().splitlines()[-1] == "bash scripts/test.sh"


def test_the_console_script_is_what_python_m_kvexplore_runs():
    """The installed ``kvexplore`` command and ``python -m kvexplore`` are one
    entry point (``kvexplore.cli.console``: ``main`` and the exit with its
    status)."""
    import ast
    import importlib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvexplore"]
    module, name = target.split(":")
    assert callable(getattr(importlib.import_module(module), name))
    tree = ast.parse((ROOT / "kvexplore" / "__main__.py").read_text())
    called = [n.func.id for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == module for a in n.names}
    assert called == [name] and name in imported
