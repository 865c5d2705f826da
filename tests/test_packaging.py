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
