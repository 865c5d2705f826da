"""The Explorer in a real browser: JupyterLab + Debian's Chromium via Playwright.

What plain pytest (tests/test_widgets.py) cannot see: that the widget
extension loads, that the Explorer renders in JupyterLab, and that a control
changed in the page reaches the kernel and comes back as new panel HTML.

The test starts its own JupyterLab on 127.0.0.1 (free port, random token,
temporary root, empty user config/settings/workspaces so nothing of the
user's leaks in), writes a notebook that displays
``Explorer("Qwen/Qwen3.5-0.8B", gpu="A100")``, runs it with "Run > Run All Cells", reads
the plan and page-map panels and the page-map figure (an ``<img>`` that has
loaded a non-empty PNG), sets TP to 4 and checks that the block size goes
544 -> 272 in the plan table, that the page map changed and that the figure's
image was replaced by a new, non-empty one.  A second test opens every
notebook under ``notebooks/`` (a glob, so new notebooks are included) in the
same JupyterLab and the same Chromium (a page of its own each) and checks
that at least one image output renders (the stored outputs, which nbval
keeps current).  Screenshots (``explorer.png`` and one
``notebook-<name>.png`` per notebook) land in ``$KVX_ARTIFACTS``, default
``test-artifacts/`` at the repository root.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the
``playwright`` Python package (``pip install playwright``; no
``playwright install``: we use Debian's browser).  ``scripts/test.sh``
installs both; a missing one is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3.5-0.8B"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
#: One notebook: open to first rendered image output and screenshot, in seconds.
NOTEBOOK_BUDGET_S = 90
#: Server start to screenshot, in seconds; with the teardown's worst case
#: (20 s for the server to stop, then a kill) the test stays under 5 minutes.
TOTAL_BUDGET_S = 260
INSTALL_HINT = (
    "run `bash scripts/test.sh` (it installs both), or by hand: "
    "`apt-get update && apt-get install -y chromium` and "
    "`python3 -m pip install playwright` (do not run `playwright install`; "
    "the test uses Debian's /usr/bin/chromium)"
)


class Deadline:
    """Milliseconds left of the test's overall time budget, for Playwright."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def ms(self, cap_s: float) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            pytest.fail(f"browser test ran past its {TOTAL_BUDGET_S} s budget")
        return 1000 * min(cap_s, left)


def _require_browser_tools():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; {INSTALL_HINT}", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(f"the playwright module is missing ({exc}); {INSTALL_HINT}", pytrace=False)
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook() -> str:
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import logging, os\n"
            "os.environ['VLLM_LOGGING_LEVEL'] = 'ERROR'\n"
            "logging.getLogger('vllm').setLevel(logging.ERROR)\n"
            "import kvexplore\n"
            "print('kvexplore from', kvexplore.__file__)"),
        nbformat.v4.new_code_cell(f"ex = kvexplore.Explorer({MODEL!r}, gpu=\"A100\")\nex"),
    ]
    nbformat.validate(nb)
    return nbformat.writes(nb)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: the server shuts its kernels down, then exits
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:  # the server's process group: a kernel that outlived the server
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """``start()`` launches a private JupyterLab (once per module; later calls
    return the same one) and returns ``(base_url, token, log_path)``; teardown
    always stops it and its kernels.  A factory, so a test checks its tools
    first and a missing one is a failure, not an error.  Its root holds the
    Explorer notebook and a copy of every notebook under ``notebooks/``."""
    started: list[tuple[subprocess.Popen, object]] = []
    running: list[tuple[str, str, Path]] = []
    tmp_path = tmp_path_factory.mktemp("jupyterlab")

    def start() -> tuple[str, str, Path]:
        if running:
            return running[0]
        root = tmp_path / "root"
        root.mkdir()
        (root / "explorer.ipynb").write_text(_notebook())
        for nb in NOTEBOOKS:
            shutil.copy(nb, root / nb.name)
        port, token = _free_port(), secrets.token_hex(24)
        env = dict(os.environ)
        # Empty user dirs: no ~/.jupyter config, lab settings, workspaces or
        # IPython startup files leak in.  JUPYTER_DATA_DIR only replaces the
        # *user* data dir; {sys.prefix}/share/jupyter (jupyterlab_widgets'
        # labextension, the python3 kernelspec) stays on the data path.
        for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                         ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
                         ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"), ("IPYTHONDIR", "ipython")]:
            (tmp_path / sub).mkdir()
            env[var] = str(tmp_path / sub)
        # Seeded lab setting: never ask about (or fetch) Jupyter news, so no toast.
        notif = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
        notif.mkdir(parents=True)
        (notif / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        # Every cell in the DOM (no windowing), so an output far down a
        # notebook can be found and scrolled to.
        tracker = tmp_path / "lab-settings" / "@jupyterlab" / "notebook-extension"
        tracker.mkdir(parents=True)
        (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        # The kernel inherits this: import this checkout's kvexplore, whatever
        # the editable install points at.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["VLLM_LOGGING_LEVEL"] = "ERROR"
        env.pop("MPLBACKEND", None)
        # Offline and quiet: no news feed, no update check, no PyPI extension manager.
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
                f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly"]
        if os.geteuid() == 0:  # CI containers run as root
            args.append("--allow-root")
        log_path = tmp_path / "jupyterlab.log"
        log = open(log_path, "wb")
        proc = subprocess.Popen(args, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        started.append((proc, log))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        running.append((base, token, log_path))
                        return base, token, log_path
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in 90 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)

    yield start
    for proc, log in started:
        try:
            _stop(proc)
        finally:
            log.close()


@pytest.fixture(scope="module")
def chromium():
    """``get()`` launches Debian's Chromium through Playwright (once per
    module; later calls return the same browser) and returns one browser
    context, so the tests' pages share JupyterLab's cached scripts; teardown
    closes it.  A factory, like :func:`jupyterlab`, so a missing tool fails
    the test that asks for it rather than erroring."""
    running: dict = {}

    def get():
        if not running:
            sync_playwright = _require_browser_tools()
            running["playwright"] = sync_playwright().start()
            running["browser"] = running["playwright"].chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
            running["context"] = running["browser"].new_context(
                viewport={"width": 1400, "height": 1000})
        return running["context"]

    yield get
    if running:
        try:
            running["browser"].close()
        finally:
            running["playwright"].stop()


def _plan_table(summary) -> dict[str, str]:
    """The plan panel's "quantity | value" table, as the browser shows it."""
    rows = summary.locator("table.kvx-table tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))")
    return {r[0]: r[1] for r in rows if len(r) >= 2}


def _fail_with_page(page, tmp_path: Path, log_path: Path, what: str, name: str = "explorer"):
    """Fail with what the page shows: prompts, outputs, a screenshot, the server log."""
    shot = _artifacts_dir() / f"{name}-failure.png"
    try:
        page.screenshot(path=str(shot), timeout=10_000)
        prompts = page.locator(".jp-NotebookPanel .jp-InputPrompt").all_inner_texts()
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea").all_inner_texts()
        dialogs = page.locator(".jp-Dialog").all_inner_texts()
        status_bar = page.locator(".jp-StatusBar-TextItem").all_inner_texts()
    except Exception as exc:  # the page itself is gone
        prompts, outputs, dialogs, status_bar = [], [f"<page unreadable: {exc}>"], [], []
    pytest.fail(f"{what}; prompts {prompts!r}, outputs {[o[-1500:] for o in outputs]!r}, "
                f"dialogs {dialogs!r}, status bar {status_bar!r}, "
                f"screenshot {shot}\nserver log tail:\n{log_path.read_text()[-3000:]}",
                pytrace=False)


def _artifacts_dir() -> Path:
    """``$KVX_ARTIFACTS``, default ``test-artifacts/`` at the repository root (git-ignored)."""
    out = Path(os.environ.get("KVX_ARTIFACTS") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


#: The notebook in the current tab (JupyterLab hides the others with lm-mod-hidden).
SHOWN_NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
#: The page-map figure: the Image widget's <img> (its class is on the element).
FIGURE = "img.kvx-figure-page-map"
_IMAGE_STATE = """img => img ? {src: img.getAttribute('src') || '', complete: img.complete,
    width: img.naturalWidth, height: img.naturalHeight} : null"""
_IMAGE_BYTES = """async img => {
    const buf = await (await fetch(img.src)).arrayBuffer();
    const b = new Uint8Array(buf);
    return {size: b.length, head: Array.from(b.slice(0, 8)),
            sum: b.reduce((h, x) => (h * 31 + x) >>> 0, 7)};
}"""


def _loaded_image(page, selector: str, timeout: float, not_src: str | None = None):
    """Wait until ``selector`` is an <img> that has decoded a non-empty image
    (and, with ``not_src``, one with another src); return its state and bytes."""
    page.wait_for_function(
        """([sel, old]) => { const img = document.querySelector(sel);
            return img && img.complete && img.naturalWidth > 0 && img.naturalHeight > 0
                && img.getAttribute('src') && img.getAttribute('src') !== old; }""",
        arg=[selector, not_src], timeout=timeout)
    img = page.locator(selector).first
    state = img.evaluate(_IMAGE_STATE)
    state["bytes"] = img.evaluate(_IMAGE_BYTES)
    return state


def test_explorer_renders_and_reacts_in_jupyterlab(jupyterlab, chromium, tmp_path):
    context = chromium()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = Deadline(TOTAL_BUDGET_S)  # the server's start (<= 90 s) counts too
    base, token, log_path = jupyterlab()
    page = context.new_page()
    try:
        page.goto(f"{base}/lab/tree/explorer.ipynb?token={token}",
                  timeout=deadline.ms(60))
        # Notebook fully loaded (both cells) and its kernel attached and
        # idle: the status bar reads "Python 3 (ipykernel) | Idle".  (The
        # toolbar's execution indicator says "idle" already while the
        # status bar still reads "No Kernel | Initializing"; a Run All
        # then finds no kernel and does nothing.)
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell').length === 2",
            timeout=deadline.ms(60))
        try:
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.jp-StatusBar-TextItem'), e => e.textContent)"
                ".some(t => /\\| Idle$/.test(t) && !t.startsWith('No Kernel'))",
                timeout=deadline.ms(90))
        except PlaywrightTimeout:
            _fail_with_page(page, tmp_path, log_path, "the notebook's kernel did not become idle")
        # Run > Run All Cells, through the real menu bar.  Belt and braces
        # for a Run All that still finds no kernel (prompts stay "[ ]:",
        # nothing is sent): re-issue it while no cell has started, never
        # once one has; a dialog (e.g. "Select Kernel") is a failure.
        for _attempt in range(3):
            if page.locator(".jp-Dialog").count():
                _fail_with_page(page, tmp_path, log_path, "JupyterLab shows a dialog")
            page.locator(".lm-MenuBar-item", has_text="Run").first.click(timeout=deadline.ms(30))
            page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click(
                timeout=deadline.ms(30))
            try:  # the first cell is queued or ran: "[*]:" or "[1]:"
                page.wait_for_function(
                    "() => /\\[(\\*|\\d+)\\]/.test("
                    "document.querySelector('.jp-NotebookPanel .jp-InputPrompt').textContent)",
                    timeout=deadline.ms(10))
                break
            except PlaywrightTimeout:
                continue
        else:
            _fail_with_page(page, tmp_path, log_path, "Run All Cells did not start the cells (3 tries)")

        explorer = page.locator(".kvx-explorer")
        try:  # first kvexplore import + first plan: 30-60 s here, often more
            explorer.wait_for(state="visible", timeout=deadline.ms(240))
        except PlaywrightTimeout:
            _fail_with_page(page, tmp_path, log_path, "the Explorer did not render")
        first_output = page.locator(".jp-NotebookPanel .jp-OutputArea").first.inner_text()
        assert f"kvexplore from {REPO / 'kvexplore'}" in first_output, first_output

        summary = page.locator(".kvx-panel-summary")
        page_map = page.locator(".kvx-panel-page-map")
        # The status panel is shown twice (above the tabs and in the
        # "status" tab): two views of one widget.
        status = page.locator(".kvx-panel-status")
        # Tabs: show "plan", read it; the page map is read as DOM text
        # (text_content works on the hidden tab too).
        page.locator(".kvx-explorer .lm-TabBar-tab", has_text="plan").click(timeout=deadline.ms(30))
        summary.locator("td", has_text="block_size").first.wait_for(timeout=deadline.ms(30))
        before = _plan_table(summary)
        before_map = page_map.text_content()
        assert before.get("tensor_parallel_size") == "1", before
        assert before.get("block_size") == "544", before
        assert "block_size=544" in before_map and "tp=1" in before_map, before_map
        assert "Traceback" not in " ".join(status.all_text_contents())
        try:  # the page-map figure: drawn by default, a decoded PNG
            before_img = _loaded_image(page, FIGURE, deadline.ms(60))
        except PlaywrightTimeout:
            _fail_with_page(page, tmp_path, log_path, "the page-map figure did not render")
        assert before_img["bytes"]["head"] == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A], before_img
        assert before_img["bytes"]["size"] > 1000, before_img

        # TP 1 -> 4 in the IntText: typed, committed with Enter.
        tp = page.locator(".kvx-control-tensor-parallel-size input")
        tp.fill("4", timeout=deadline.ms(30))
        tp.press("Enter")
        # the panels re-render one after another: wait for both
        page.wait_for_function(
            "() => /block_size=272\\b/.test(document.querySelector('.kvx-panel-summary').textContent)"
            " && /block_size=272\\b/.test(document.querySelector('.kvx-panel-page-map').textContent)",
            timeout=deadline.ms(60),
        )
        after = _plan_table(summary)
        after_map = page_map.text_content()
        assert after.get("tensor_parallel_size") == "4", after
        assert after.get("block_size") == "272", after
        assert after.get("mamba_page_size_padded") != before.get("mamba_page_size_padded")
        assert after_map != before_map
        assert "block_size=272" in after_map and "tp=4" in after_map, after_map
        assert "Traceback" not in " ".join(status.all_text_contents())
        try:  # a new figure for the new plan: another src, other bytes
            after_img = _loaded_image(page, FIGURE, deadline.ms(60), not_src=before_img["src"])
        except PlaywrightTimeout:
            _fail_with_page(page, tmp_path, log_path, "the page-map figure did not change after TP 1 -> 4")
        assert after_img["bytes"]["head"] == before_img["bytes"]["head"], after_img
        assert after_img["bytes"]["size"] > 1000, after_img
        assert after_img["bytes"]["sum"] != before_img["bytes"]["sum"], (before_img, after_img)

        page.locator(".kvx-explorer .lm-TabBar-tab", has_text="page map").click(timeout=deadline.ms(30))
        page_map.wait_for(state="visible", timeout=deadline.ms(30))
        shot = _artifacts_dir() / "explorer.png"
        explorer.screenshot(path=str(shot), timeout=deadline.ms(30))
    finally:
        page.close()
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000, shot.stat().st_size


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 7, NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_renders_an_image(jupyterlab, chromium, notebook: Path):
    """Open the notebook in JupyterLab: at least one image output is decoded."""
    context = chromium()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    base, token, log_path = jupyterlab()
    deadline = Deadline(NOTEBOOK_BUDGET_S)
    shot = _artifacts_dir() / f"notebook-{notebook.stem}.png"
    page = context.new_page()
    try:
        # A workspace of its own: JupyterLab would otherwise restore the
        # notebooks earlier tests opened, as background tabs.
        page.goto(f"{base}/lab/workspaces/nb-{notebook.stem}/tree/{notebook.name}?token={token}",
                  timeout=deadline.ms(60))
        image = page.locator(f"{SHOWN_NOTEBOOK} .jp-OutputArea-output img").first
        try:
            image.wait_for(state="attached", timeout=deadline.ms(60))
            image.scroll_into_view_if_needed(timeout=deadline.ms(30))
            page.wait_for_function(
                "sel => Array.from(document.querySelectorAll(sel))"
                ".some(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0)",
                arg=f"{SHOWN_NOTEBOOK} .jp-OutputArea-output img", timeout=deadline.ms(30))
        except PlaywrightTimeout:
            _fail_with_page(page, shot.parent, log_path, f"{notebook.name}: no image output rendered",
                            name=f"notebook-{notebook.stem}")
        title = page.locator(".lm-DockPanel-tabBar .lm-mod-current .lm-TabBar-tabLabel").first.inner_text()
        assert title == notebook.name, title
        rendered = page.locator(f"{SHOWN_NOTEBOOK} .jp-OutputArea-output img").evaluate_all(
            "imgs => imgs.filter(i => i.complete && i.naturalWidth > 0).map(i => i.naturalWidth)")
        assert rendered and min(rendered) > 50, rendered
        page.screenshot(path=str(shot), timeout=deadline.ms(30))
    finally:
        page.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
