"""The benchmark scripts still reach what they time: every kvexplore name a
script imports or reads off a kvexplore module exists (the scripts themselves
run for minutes and are not run here)."""

import ast
import importlib
import pathlib

import pytest

BENCHMARKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def _kvexplore_names(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, module, attribute)`` for every kvexplore name the script uses."""
    modules: dict[str, str] = {}  # local name -> kvexplore module it is bound to
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "kvexplore":
                    modules[a.asname or "kvexplore"] = a.name if a.asname else "kvexplore"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvexplore":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                try:
                    importlib.import_module(full)
                    modules[a.asname or a.name] = full
                except ImportError:
                    used.append((node.lineno, node.module, a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                module = modules[base.id]
                for attr in reversed(chain):  # descend through submodules
                    try:
                        importlib.import_module(f"{module}.{attr}")
                        module = f"{module}.{attr}"
                    except ImportError:
                        used.append((node.lineno, module, attr))
                        break
    return used


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_names_exist(script):
    used = _kvexplore_names(ast.parse(script.read_text()))
    missing = [f"{script.name}:{line}: {module}.{attr}" for line, module, attr in used
               if not hasattr(importlib.import_module(module), attr)]
    assert missing == []


def test_the_check_sees_a_missing_name():
    tree = ast.parse("from kvexplore.planning import planner\nplanner._BUILD_CACHE\n"
                     "from kvexplore.rendering.layouts import no_such_function\n")
    found = {(m, a) for _, m, a in _kvexplore_names(tree)
             if not hasattr(importlib.import_module(m), a)}
    assert found == {("kvexplore.planning.planner", "_BUILD_CACHE"),
                     ("kvexplore.rendering.layouts", "no_such_function")}
    assert len(BENCHMARKS) >= 6
