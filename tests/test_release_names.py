"""Release facts come from ``kvexplore.planning.release``: no module after it
spells a vLLM release, reads vLLM's ``CacheDType`` or probes a release's
classes with ``hasattr`` itself."""

import ast
import inspect
import pathlib
import re
from typing import get_args

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kvexplore"
RELEASE = re.compile(r"\b\d+\.\d+\.\d+\b")
#: Modules that once spelled release facts of their own.
MODULES = ("cli.py", "versions/compare.py", "explorer/state.py", "offloading/config.py")


def _code_strings(tree: ast.AST):
    """String constants other than docstrings."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        )
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
        ):
            yield node


def test_no_release_literal_cache_dtype_or_hasattr_probe_outside_the_release_module():
    found = []
    for name in MODULES:
        tree = ast.parse((ROOT / name).read_text())
        found += [
            f"{name}:{c.lineno}: {c.value!r}"
            for c in _code_strings(tree)
            if RELEASE.search(c.value)
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "vllm.config.cache":
                found.append(f"{name}:{node.lineno}: imports {node.module}")
            if (
                name.startswith("offloading/")
                and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
            ):
                found.append(f"{name}:{node.lineno}: hasattr")
    assert found == []


def test_a_comparison_names_the_windows_newest_two_releases_by_default():
    from kvexplore.cli import build_parser
    from kvexplore.planning.release import WINDOW_RELEASES
    from kvexplore.versions.compare import compare_versions

    newest_two = sorted(WINDOW_RELEASES, key=lambda r: tuple(map(int, r.split("."))))[
        -2:
    ]
    assert (
        list(inspect.signature(compare_versions).parameters["vllm"].default)
        == newest_two
    )
    ns = build_parser().parse_args(["versions", "Qwen/Qwen3.5-0.8B"])
    assert ns.vllm == ",".join(newest_two)


def test_the_explorers_kv_cache_dtypes_are_vllms():
    from vllm.config.cache import CacheDType

    from kvexplore.explorer.state import choices

    assert choices()["kv_cache_dtype"] == list(get_args(CacheDType))
