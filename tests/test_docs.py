"""The documentation site, built as ``bash scripts/docs.sh`` builds it and read
in a real browser.

One strict build (``mkdocs build --strict``: a broken link, a missing page or
a docstring that does not render stops it) into a temporary folder, then
checks on the files: every ``##`` section of ``README.md`` is a heading of
some page, every notebook under ``notebooks/`` is a page, every name of
``kvexplore.__all__`` has an API entry rendered by mkdocstrings, every page
names the vLLM release ``scripts/default-release.txt`` pins and the LMCache
release the README calls the default, and every local link or image of every
page resolves inside the site (so the folder works wherever it is put: no
link starts with ``/``).  Then one Chromium session (Debian's
``/usr/bin/chromium``, driven by Playwright as in ``tests/test_browser.py``)
over the folder served by a local ``http.server`` thread: every page loads
without a script error or a failed request, every notebook page shows at least as many images as
the notebook stores ``image/png`` outputs (each ``<img>`` decoded,
``naturalWidth > 0``), and the search box finds "block size" and
"mamba_block_size".  Screenshots ``docs-home.png`` and
``docs-notebook-01-tour.png`` land in ``$KVX_ARTIFACTS`` (default
``test-artifacts/``).

Needs the ``docs`` extra (``python3 -m pip install -e ".[docs]"``; the ``test``
extra includes it), ``/usr/bin/chromium`` and the ``playwright`` package;
a missing one is a failure, not a skip.
"""

from __future__ import annotations

import functools
import html
import html.parser
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import kvexplore

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
SCREENSHOT_NOTEBOOK = "01-tour"
SEARCHES = ("block size", "mamba_block_size")
DOCS_HINT = (
    'run `python3 -m pip install -e ".[docs]"` (the test extra includes it; '
    "`bash scripts/test.sh` installs it)"
)
BROWSER_HINT = (
    "run `bash scripts/test.sh` (it installs both), or by hand: "
    "`apt-get update && apt-get install -y chromium` and "
    "`python3 -m pip install playwright` (do not run `playwright install`; "
    "the test uses Debian's /usr/bin/chromium)"
)


def _artifacts_dir() -> Path:
    out = Path(os.environ.get("KVX_ARTIFACTS") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """``build()`` runs the strict build once (later calls return the same
    folder); a factory, so a missing tool is a test failure, not an error."""
    built: list[Path] = []

    def build() -> Path:
        if built:
            return built[0]
        for module in (
            "mkdocs",
            "material",
            "mkdocs_jupyter",
            "mkdocstrings_handlers.python",
        ):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                pytest.fail(f"{module} is missing; {DOCS_HINT}", pytrace=False)
        out = tmp_path_factory.mktemp("docs") / "site"
        env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mkdocs",
                "build",
                "--strict",
                "-f",
                str(REPO / "mkdocs.yml"),
                "-d",
                str(out),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            pytest.fail(
                f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}",
                pytrace=False,
            )
        built.append(out)
        return out

    return build


def _pages(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.html") if p.name != "404.html")


class _Links(html.parser.HTMLParser):
    """Every ``href`` / ``src`` of a page, and every element ``id``."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("href", "src") and value is not None:
                self.targets.append(value)
            if key == "id" and value:
                self.ids.add(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text())
    return parser


def _headings(page: Path) -> list[str]:
    text = page.read_text()
    found = re.findall(r"<h[12][^>]*>(.*?)</h[12]>", text, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", h)).strip(" ¶") for h in found]


def test_pages_links_and_releases(site):
    root = site()
    pages = _pages(root)
    # every README section is a heading of some page
    readme = (REPO / "README.md").read_text()
    readme = re.sub(r"```.*?```", "", readme, flags=re.S)
    sections = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert len(sections) >= 10, sections
    headings = {h for page in pages for h in _headings(page)}
    missing = [s for s in sections if s.strip() not in headings]
    assert not missing, f"README sections on no page: {missing}"
    # every notebook is a page
    for nb in NOTEBOOKS:
        assert (root / "notebooks" / f"{nb.stem}.html").is_file(), nb.name
    # every public name has a rendered API entry: the anchor, then mkdocstrings' object
    api = "".join(p.read_text() for p in sorted((root / "api").glob("*.html")))
    for name in kvexplore.__all__:
        at = api.find(f'id="kvexplore.{name}"')
        assert at >= 0, f"no API entry for kvexplore.{name}"
        entry = api[at : api.find("<h2", at + 1)]
        assert 'class="doc doc-' in entry, (
            f"kvexplore.{name}: mkdocstrings rendered nothing"
        )
    # every page names the releases its numbers are for
    pin = re.search(
        r"^vllm==(\S+)", (REPO / "scripts" / "default-release.txt").read_text(), re.M
    )[1]
    lmcache = re.search(
        r"else (\d+\.\d+\.\d+), the newest stable release",
        (REPO / "README.md").read_text(),
    )
    assert lmcache, "README no longer says which LMCache release is the default"
    for page in pages:
        text = _text(page)
        assert f"Numbers on this page are for vLLM {pin}" in text, page
        assert f"LMCache {lmcache[1]}" in text, page
    # every local link and image resolves inside the folder (relocatable)
    ids = {page: _parse(page) for page in pages}
    broken = []
    for page, links in ids.items():
        for target in links.targets:
            parts = urlsplit(target)
            if parts.scheme or target.startswith("//"):
                continue
            if target.startswith("/"):
                broken.append((page.relative_to(root), target, "absolute"))
                continue
            dest = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.is_file() or root.resolve() not in dest.parents:
                broken.append((page.relative_to(root), target, "missing"))
            elif parts.fragment and dest.suffix == ".html":
                known = ids[dest].ids if dest in ids else _parse(dest).ids
                if unquote(parts.fragment) not in known:
                    broken.append((page.relative_to(root), target, "no such anchor"))
    assert not broken, broken[:20]


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page.read_text())))


def _stored_images(notebook: Path) -> int:
    cells = json.loads(notebook.read_text())["cells"]
    return sum(
        1
        for cell in cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    )


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_site_in_chromium(site):
    root = site()
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; {BROWSER_HINT}", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(
            f"the playwright module is missing ({exc}); {BROWSER_HINT}", pytrace=False
        )
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    shots = _artifacts_dir()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=["--no-sandbox", "--disable-gpu"],
            )
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # a load the next navigation cancels (ERR_ABORTED) is not a failure
                page.on(
                    "requestfailed",
                    lambda r: (
                        r.failure == "net::ERR_ABORTED"
                        or errors.append(f"{r.url}: {r.failure}")
                    ),
                )
                page.on(
                    "response",
                    lambda r: r.status < 400 or errors.append(f"{r.url}: {r.status}"),
                )
                for path in _pages(root):
                    rel = path.relative_to(root).as_posix()
                    response = page.goto(base + rel, wait_until="load", timeout=60_000)
                    assert response is not None and response.ok, (
                        rel,
                        response and response.status,
                    )
                    assert page.locator("article.md-content__inner").count() == 1, rel
                    if rel.startswith("notebooks/"):
                        images = page.evaluate(
                            "() => Array.from(document.querySelectorAll('article img'))"
                            ".map(i => i.complete ? i.naturalWidth : 0)"
                        )
                        stored = _stored_images(
                            REPO / "notebooks" / f"{path.stem}.ipynb"
                        )
                        assert stored >= 1, f"{path.stem}.ipynb stores no image output"
                        assert len(images) >= stored, (rel, len(images), stored)
                        assert all(w > 0 for w in images), (rel, images)
                        if path.stem == SCREENSHOT_NOTEBOOK:
                            page.screenshot(
                                path=str(shots / f"docs-notebook-{path.stem}.png")
                            )
                    assert not errors, (rel, errors)
                page.goto(base + "index.html", wait_until="load")
                page.screenshot(path=str(shots / "docs-home.png"))
                for query in SEARCHES:
                    box = page.locator("input.md-search__input")
                    box.click()
                    box.press_sequentially(query, delay=20)
                    results = page.locator("li.md-search-result__item")
                    results.first.wait_for(timeout=30_000)
                    marked = " ".join(
                        page.locator(".md-search-result mark").all_inner_texts()
                    ).lower()
                    for word in query.split():
                        assert word in marked, (query, word, marked[:300])
                    hrefs = page.locator("a.md-search-result__link").evaluate_all(
                        "links => links.map(a => a.getAttribute('href'))"
                    )
                    found = {urlsplit(h).path.lstrip("/") for h in hrefs}
                    assert any(query in _text(root / f).lower() for f in found), (
                        query,
                        sorted(found),
                    )
                    box.fill("")
                    page.keyboard.press("Escape")
                assert not errors, errors
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
