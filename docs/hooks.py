"""The documentation site's pages, made from the repository at build time
(an MkDocs hook, named in ``mkdocs.yml``).

* ``README.md`` is split at its ``##`` headings into the pages of
  :data:`README_PAGES`; a README section that no page takes, or a page
  section the README lacks, stops the build (a ``PluginError``).
* Every notebook under ``notebooks/`` becomes a page (``notebooks/NAME.html``,
  rendered by mkdocs-jupyter from its stored outputs).
* The API reference has one page per pipeline stage, one mkdocstrings entry per
  name of ``kvexplore.__all__``, each under a heading whose anchor is the
  public name (``#kvexplore.plan``); each name's defining module is found by
  reading the package's source with griffe (nothing of kvexplore beyond its
  ``__all__`` and :mod:`kvexplore.planning.release` is imported, so vLLM is not).
* Every page's template states the releases its numbers are for: the vLLM
  release pinned in ``scripts/default-release.txt`` (the one the stored
  notebook outputs come from), the window of
  :mod:`kvexplore.planning.release`, and LMCache's ``NEWEST_STABLE`` of
  :mod:`kvexplore.editing.lmcache` (kvexplore's default when no LMCache is
  installed).
* Sphinx roles in docstrings (``:class:`~a.b.C```) render as code (``C``).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import griffe
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]

#: Site page, its title, and the README sections (``##`` headings) it holds,
#: in the order of the navigation.
README_PAGES = (
    (
        "getting-started.md",
        "Getting started",
        ("Two commands", "Python", "Documentation"),
    ),
    ("how-a-plan-is-made.md", "How a plan is made", ("How a plan is made",)),
    ("releases.md", "vLLM releases", ("Releases",)),
    ("lmcache-releases.md", "LMCache releases", ("LMCache releases",)),
    ("capacity.md", "Capacity", ("Capacity",)),
    ("will-it-start.md", "Will it start?", ("Will it start?",)),
    ("what-to-run.md", "What should I run?", ("What should I run?",)),
    ("what-lmcache-stores.md", "What LMCache stores", ("What LMCache stores",)),
    ("logs.md", "Your start-up log", ("Your start-up log",)),
    ("explorer.md", "The Explorer", ("Explorer",)),
    ("cli.md", "The command line", ("CLI",)),
    ("fleet-sweeps.md", "Fleet sweeps", ("Fleet sweeps",)),
    ("layout.md", "Package layout and figures", ("Layout", "Figures")),
)

#: API page per pipeline stage: the module prefix a name's definition lies
#: under, the page and its title; the first matching prefix wins.
API_STAGES = (
    ("kvexplore.planning", "api/planning.md", "Planning"),
    ("kvexplore.registration", "api/registration.md", "Registration"),
    ("kvexplore.editing", "api/editing.md", "LMCache edits and the round trip"),
    ("kvexplore.connectors", "api/connectors.md", "What LMCache stores"),
    ("kvexplore.offloading", "api/offloading.md", "Offloading"),
    ("kvexplore.capacity_planning", "api/capacity.md", "Capacity"),
    ("kvexplore.logs", "api/logs.md", "Start-up logs"),
    ("kvexplore.advising", "api/advising.md", "What to run"),
    ("kvexplore.rendering", "api/rendering.md", "Rendering"),
    ("kvexplore.versions", "api/versions.md", "vLLM and LMCache releases"),
    ("kvexplore.explorer", "api/explorer.md", "The Explorer"),
    ("kvexplore", "api/errors.md", "Errors"),
)

ROLE = re.compile(
    r":(?:class|func|data|mod|attr|meth|exc|obj|const):<code>~?([^<]*)</code>"
)
HEADING_ID = re.compile(r"<h[1-6][^>]*\bid=\"([^\"]+)\"")
#: nbconvert's loader of the widget renderer from unpkg.com (it needs the
#: network and require.js, so a static site cannot use it), the widget state
#: it would read, and each widget output.
WIDGET_LOADER = re.compile(
    r"<script>(?:(?!</script>).)*?addWidgetsRenderer(?:(?!</script>).)*?</script>", re.S
)
WIDGET_STATE = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-state\+json">.*?</script>', re.S
)
WIDGET_VIEW = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-view\+json">.*?</script>', re.S
)
WIDGET_NOTE = (
    '<p class="kvx-widget">An interactive widget: it runs in JupyterLab '
    "(<code>bash scripts/start.sh</code>), not on this static page.</p>"
)
NOTEBOOK_MENTION = re.compile(r"`(notebooks/[\w.-]+\.ipynb)`")


def _fence_aware_sections(text: str) -> tuple[str, dict[str, str]]:
    """README's text before its first ``##`` heading, and each ``##``
    section's body by heading (headings inside code fences are code)."""
    intro: list[str] = []
    sections: dict[str, list[str]] = {}
    current = intro
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            title = line[3:].strip()
            if title in sections:
                raise PluginError(f"README.md has two sections named {title!r}")
            current = sections[title] = []
            continue
        current.append(line)
    return "\n".join(intro), {k: "\n".join(v) for k, v in sections.items()}


def _linked(markdown: str) -> str:
    """``notebooks/NAME.ipynb`` mentions as links to the notebook's page (a
    README page sits at the site's root, beside ``notebooks/``)."""
    return NOTEBOOK_MENTION.sub(
        lambda m: f"[`{m[1]}`]({m[1]})" if (REPO / m[1]).is_file() else m[0],
        markdown,
    )


def _readme_pages() -> dict[str, str]:
    intro, sections = _fence_aware_sections((REPO / "README.md").read_text())
    taken = [s for _, _, names in README_PAGES for s in names]
    untaken = [s for s in sections if s not in taken]
    if untaken:
        raise PluginError(
            f"README.md sections {untaken} are on no page of docs/hooks.py README_PAGES"
        )
    missing = [s for s in taken if s not in sections]
    if missing:
        raise PluginError(
            f"README_PAGES in docs/hooks.py names sections {missing} that README.md lacks"
        )
    pages = {}
    for path, title, names in README_PAGES:
        if len(names) == 1:
            body = re.sub(r"^###", "##", sections[names[0]], flags=re.M)
            text = f"# {names[0]}\n{body}"
        else:
            text = f"# {title}\n\n" + "\n".join(f"## {n}\n{sections[n]}" for n in names)
        pages[path] = _linked(text)
    links = "\n".join(f"- [{title}]({path})" for path, title, _ in README_PAGES)
    notebooks = "\n".join(
        f"- [`{nb.stem}`](notebooks/{nb.name})" for nb in _notebooks()
    )
    pages["index.md"] = (
        f"{_linked(intro).strip()}\n\n## Pages\n\n{links}\n- [API reference](api/index.md)\n\n"
        f"## Notebooks\n\nEach rendered with the outputs and figures stored in it "
        f"(they run as tests under nbval).\n\n{notebooks}\n"
    )
    return pages


def _notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("*.ipynb"))


def _definitions() -> dict[str, str]:
    """Each name of ``kvexplore.__all__`` and the path of the object it is,
    where its source defines it (``plan``: ``kvexplore.planning.planner.plan``)."""
    import kvexplore

    package = griffe.load("kvexplore", search_paths=[str(REPO)], resolve_aliases=False)
    found: dict[str, list[str]] = {}

    def walk(module):
        for name, member in module.members.items():
            if member.is_alias:
                continue
            if member.is_module:
                walk(member)
            else:
                found.setdefault(name, []).append(member.path)

    walk(package)
    paths = {}
    for name in kvexplore.__all__:
        where = found.get(name, [])
        if len(where) != 1:
            raise PluginError(
                f"kvexplore.{name} is defined in {len(where)} places ({where}); the API "
                "reference needs exactly one"
            )
        paths[name] = where[0]
    return paths


def _api_pages() -> dict[str, str]:
    stages: dict[str, list[tuple[str, str]]] = {}
    for name, path in _definitions().items():
        page = next(
            p
            for prefix, p, _ in API_STAGES
            if path == prefix or path.startswith(prefix + ".")
        )
        stages.setdefault(page, []).append((name, path))
    pages = {}
    index = [
        "# API reference",
        "",
        "Every public name of `kvexplore` (its `__all__`), from its docstring, "
        "grouped by pipeline stage. Import them from the package: "
        "`kvexplore.plan`, `kvexplore.Plan`, ...",
        "",
    ]
    for _, page, title in API_STAGES:
        entries = sorted(stages.get(page, []), key=lambda e: e[0].lower())
        if not entries:
            continue
        rel = page.removeprefix("api/")
        index.append(f"## [{title}]({rel})\n")
        index.append(
            ", ".join(f"[`{n}`]({rel}#kvexplore.{n})" for n, _ in entries) + "\n"
        )
        body = [f"# {title}", ""]
        for name, path in entries:
            body += [
                f"## `kvexplore.{name}` {{#kvexplore.{name} }}",
                "",
                f"::: {path}",
                "",
            ]
        pages[page] = "\n".join(body)
    pages["api/index.md"] = "\n".join(index)
    return pages


def _lmcache_default() -> str:
    """``NEWEST_STABLE`` as ``kvexplore/editing/lmcache.py`` assigns it."""
    module = griffe.load(
        "kvexplore.editing.lmcache", search_paths=[str(REPO)], resolve_aliases=False
    )
    return ast.literal_eval(str(module.members["NEWEST_STABLE"].value))


def _vllm_default() -> str:
    from kvexplore.planning.release import WINDOW_RELEASES

    text = (REPO / "scripts" / "default-release.txt").read_text()
    pins = re.findall(r"^vllm==(\S+)\s*$", text, flags=re.M)
    if len(pins) != 1 or pins[0] not in WINDOW_RELEASES:
        raise PluginError(
            f"scripts/default-release.txt pins {pins}; expected one vllm==R with R in {WINDOW_RELEASES}"
        )
    return pins[0]


#: The generated pages (path: markdown), made once per build by :func:`on_config`.
PAGES: dict[str, str] = {}


def on_config(config):
    # the site documents the kvexplore beside this file, whatever else is
    # installed (MkDocs restores sys.path after loading a hook, so here)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from kvexplore.planning.release import window_text

    PAGES.clear()
    PAGES.update(_readme_pages())
    PAGES.update(_api_pages())

    config.extra["kvx_vllm"] = _vllm_default()
    config.extra["kvx_window"] = window_text()
    config.extra["kvx_lmcache"] = _lmcache_default()
    readme = [{title: path} for path, title, _ in README_PAGES]
    notebooks = [f"notebooks/{nb.name}" for nb in _notebooks()]
    api = ["api/index.md"] + [
        {title: page} for _, page, title in API_STAGES if page in PAGES
    ]
    config.nav = [
        {"Home": "index.md"},
        *readme,
        {"Notebooks": notebooks},
        {"API reference": api},
    ]
    return config


@event_priority(100)  # before mkdocs-jupyter, which takes the notebooks as pages
def on_files(files, config):
    for path, text in PAGES.items():
        files.append(File.generated(config, path, content=text))
    for nb in _notebooks():
        files.append(
            File(
                f"notebooks/{nb.name}",
                str(REPO),
                config.site_dir,
                config.use_directory_urls,
            )
        )
    return files


def _toc_items(items):
    for item in items:
        yield item
        yield from _toc_items(item.children)


def on_page_content(html, page, config, files):
    """Sphinx roles as code.  On a notebook page: each widget output as a
    note that it runs in JupyterLab (the page loads nothing from elsewhere),
    and the table of contents pointed at the ids its headings carry
    (mkdocs-jupyter slugs its table of contents from the headings' text
    without their code spans, nbconvert slugs the ids with them): the n-th
    entry is the n-th heading, when the counts agree; the page's title is its
    first heading's whole text (code spans too)."""
    if page.file.src_uri.endswith(".ipynb"):
        html = WIDGET_VIEW.sub(
            WIDGET_NOTE, WIDGET_STATE.sub("", WIDGET_LOADER.sub("", html))
        )
        h1 = re.search(r"<h1[^>]*>(.*?)</h1>", html, re.S)
        if h1:  # the whole heading, code spans included
            page.title = re.sub(r"<[^>]+>|&para;|¶", "", h1[1]).strip()
        ids = HEADING_ID.findall(html)
        items = list(_toc_items(page.toc))
        if len(ids) == len(items):
            for item, heading_id in zip(items, ids, strict=True):
                item.id = heading_id
    return ROLE.sub(lambda m: f"<code>{m[1].rsplit('.', 1)[-1]}</code>", html)
