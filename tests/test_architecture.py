"""The package reads as the pipeline: imports only point down it.

Parsed from the source (every ``import`` statement, including those inside
functions), so a new import that runs against the flow, or reaches into
another module's private names, fails here.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kvexplore"

#: Pipeline stages in order; a module may import its own stage and earlier ones.
STAGES = [
    ("base", ["kvexplore.errors", "kvexplore.layout", "kvexplore.memo", "kvexplore.display",
              "kvexplore.paths", "kvexplore.version", "kvexplore.store", "kvexplore.lazy"]),
    ("planning", ["kvexplore.planning"]),
    ("fleet", ["kvexplore.fleet"]),
    # one uv environment per vLLM release, where work of another release runs
    ("environments", ["kvexplore.versions.environments"]),
    ("registration", ["kvexplore.registration"]),
    # the page model: a registered layer's page segments and byte views
    ("pages", ["kvexplore.pages"]),
    ("editing", ["kvexplore.editing"]),
    ("connectors", ["kvexplore.connectors"]),
    ("offloading", ["kvexplore.offloading"]),
    ("capacity", ["kvexplore.capacity_planning"]),
    ("logs", ["kvexplore.logs"]),
    # what to run: settings searched on the plan, capacity and vLLM's scheduler
    ("advising", ["kvexplore.advising"]),
    ("rendering", ["kvexplore.rendering"]),
    ("versions", ["kvexplore.versions"]),
    ("explorer", ["kvexplore.explorer"]),
    ("cli", ["kvexplore.cli", "kvexplore.__main__"]),
    ("package", ["kvexplore"]),
]

#: Imports up the pipeline that are allowed: none (a stage hands its result to
#: the next as data; the package re-exports every stage's functions).
ALLOWED_UP: set[tuple[str, str]] = set()


def _stage(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, module
    return best[0]


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name


MODULES = dict(_modules())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_pipeline(module):
    if module == "kvexplore":
        return  # the package re-exports every stage
    here = _stage(module)
    for target, _ in _imports(MODULES[module]):
        if not target.startswith("kvexplore"):
            continue
        if (module, target) in ALLOWED_UP:
            continue
        assert _stage(target) <= here, f"{module} imports {target}, a later stage"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_across_modules(module):
    for target, name in _imports(MODULES[module]):
        if not target.startswith("kvexplore") or name is None:
            continue
        if name.startswith("_") and target != module:
            pytest.fail(f"{module} imports the private name {name} from {target}")


def test_no_import_cycles_between_modules():
    graph = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for target, name in _imports(path):
            if (m, target) in ALLOWED_UP:
                continue  # a documented call up the pipeline, imported inside a method
            if target in graph and target != m:
                graph[m].add(target)
            if name and f"{target}.{name}" in graph:
                graph[m].add(f"{target}.{name}")
    # a package __init__ importing its own submodules is how re-exports work
    for m in list(graph):
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") and MODULES[m].name == "__init__.py")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)



def test_the_package_docstring_lists_every_stage_in_pipeline_order():
    import re

    doc = ast.get_docstring(ast.parse((ROOT / "__init__.py").read_text()))
    named = re.findall(r":mod:`(kvexplore[\w.]*)`", doc)
    order = [_stage(m) for m in named]
    assert order == sorted(order), named
    listed = set(named)
    missing = [prefix for _, prefixes in STAGES[:-1] for prefix in prefixes
               if prefix not in listed and prefix != "kvexplore.__main__"]
    assert missing == []


def test_the_capacity_report_documents_every_field():
    """Each public field of ``CapacityReport`` is named in its docstring, and
    none is typed ``Any``."""
    tree = ast.parse((ROOT / "capacity_planning.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "CapacityReport")
    fields = {n.target.id: ast.unparse(n.annotation) for n in cls.body
              if isinstance(n, ast.AnnAssign) and not n.target.id.startswith("_")}
    doc = ast.get_docstring(cls)
    assert len(fields) > 30
    assert [f for f in fields if f"``{f}``" not in doc] == []
    assert [f for f, kind in fields.items() if kind == "Any"] == []

#: Names of working papers, folders and tools that are not part of this
#: repository; code, tests, benchmarks, notebooks and docs must not send a
#: reader to them (public sources are cited by URL).
OUTSIDE_REFERENCES = (
    r"\bGUIDE\b",
    r"\b" + "seed" + r" 00\d\b",
    r"\bthe " + "seed" + r"('s)?\b",
    r"\b" + "seeds" + r"/",
    r"\.\./" + r"shared\b",
    r"\(" + "issue" + r" \d+\)",
    r"\bsee " + "issue" + r" \d+",
    r"\b" + "issue" + r"s? (show|note|resolved)\b",
    r"\bhelper " + "search",
    r"\b(read|find)_" + r"(file|string|repos)\b",
    r"\bsearch[- ]" + "index" + r"\b",
)


def test_the_repository_stands_on_its_own():
    import re

    repo = ROOT.parent
    pattern = re.compile("|".join(OUTSIDE_REFERENCES), re.IGNORECASE)
    files = [p for d in ("kvexplore", "tests", "benchmarks", "notebooks", "scripts")
             for p in (repo / d).rglob("*") if p.suffix in (".py", ".ipynb", ".md", ".sh", ".cfg")]
    files.append(repo / "README.md")
    hits = [f"{p.relative_to(repo)}:{n}: {line.strip()[:80]}"
            for p in files for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert len(files) > 50
    assert hits == []


def test_the_tour_is_the_one_entry_point():
    """notebooks/01-tour links every other notebook; no other notebook calls
    itself the place to start; the ambiguous ``padding_%`` column is gone
    (``padding_share`` is the padding's share of the page, ``padding_overhead``
    its share of the state)."""
    import json
    import re

    notebooks = sorted((ROOT.parent / "notebooks").glob("*.ipynb"))
    text = {p.stem: "".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"])
            for p in notebooks}
    assert len(text) >= 11
    tour = text.pop("01-tour")
    assert [name for name in text if name not in tour] == []
    assert [name for name, body in text.items() if re.search(r"(?i)start here", body)] == []
    assert [name for name, body in {**text, "01-tour": tour}.items() if '"padding_%"' in body] == []
