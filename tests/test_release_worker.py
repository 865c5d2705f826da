"""The release worker: one long-lived process per release environment that
answers many questions, restarted once if it dies, refused if it dies
again, gone when idle, when closed and when its parent is killed.

The questions are a probe module put on the worker's ``PYTHONPATH`` (it
prints its release and process id, or ends its process), so no vLLM model
is built here; ``test_versions`` asks the worker real questions.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kvexplore.errors import KVExploreError
from kvexplore.versions.environments import ReleaseWorker, answer_in, release_worker

INSTALLED = importlib.metadata.version("vllm")
OTHER = "0.34.0" if INSTALLED != "0.34.0" else "0.33.0"

PROBE = '''
import importlib.metadata, json, os, sys

def main(argv):
    if argv[0] == "die":
        os._exit(3)
    print("noise a question may print first")
    print(json.dumps({"vllm": importlib.metadata.version("vllm"), "pid": os.getpid(),
                      "argument": argv[0]}))
'''


@pytest.fixture
def probe(tmp_path, monkeypatch):
    (tmp_path / "kvx_probe.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return "kvx_probe"


def _gone(pid: int, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # reap it where it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    return False


def test_one_worker_answers_many_questions(probe):
    w = ReleaseWorker(OTHER)
    try:
        first = w.ask(probe, "a")
        second = w.ask(probe, "b")
        assert first["vllm"] == second["vllm"] == OTHER
        assert first["pid"] == second["pid"] == w.pid  # the same process
        assert (first["argument"], second["argument"]) == ("a", "b")
    finally:
        w.close()
    assert w.pid is None and _gone(first["pid"])


def test_a_killed_worker_is_restarted_and_one_dying_twice_refused(probe):
    w = ReleaseWorker(OTHER)
    try:
        pid = w.ask(probe, "a")["pid"]
        os.kill(pid, signal.SIGKILL)
        assert _gone(pid)
        again = w.ask(probe, "b")
        assert again["pid"] != pid and again["vllm"] == OTHER
        with pytest.raises(KVExploreError, match="ended twice") as info:
            w.ask(probe, "die")
        assert f"vllm-{OTHER}" in str(info.value)
        assert w.ask(probe, "c")["vllm"] == OTHER  # a new question starts a new worker
    finally:
        w.close()


def test_a_question_that_fails_is_one_error_and_the_worker_stays(probe):
    w = ReleaseWorker(OTHER)
    try:
        pid = w.ask(probe, "a")["pid"]
        with pytest.raises(KVExploreError, match="ModuleNotFoundError") as info:
            w.ask("kvx_no_such_module", "a")
        assert f"vLLM {OTHER}" in str(info.value)
        assert w.ask(probe, "b")["pid"] == pid
    finally:
        w.close()


def test_an_idle_worker_exits_and_the_next_question_starts_one(probe, monkeypatch):
    monkeypatch.setenv("KVEXPLORE_WORKER_IDLE_S", "1")
    w = ReleaseWorker(OTHER)
    try:
        pid = w.ask(probe, "a")["pid"]
        assert _gone(pid, 20)
        assert w.ask(probe, "b")["pid"] != pid
    finally:
        w.close()


def _killed_parent_leaves_no_worker(code: str) -> None:
    """Run ``code`` (it prints ``{"pid": the worker's pid}`` last) in a parent
    that then kills itself with SIGKILL (no atexit): the worker's input ends
    and it exits."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)
         + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"],
        stdout=subprocess.PIPE, text=True)
    out, _ = parent.communicate(timeout=600)
    assert parent.returncode == -signal.SIGKILL
    pid = json.loads(out.strip().splitlines()[-1])["pid"]
    assert _gone(pid)


def test_the_worker_ends_with_a_killed_parent(probe):
    _killed_parent_leaves_no_worker(f"""
        import json
        from kvexplore.versions.environments import release_worker
        print(json.dumps(release_worker({OTHER!r}).ask({probe!r}, "a")), flush=True)
        """)


def test_answer_in_uses_the_releases_worker(probe):
    """answer_in asks the one worker of its release (this process's) and
    checks the release the answer names.  A worker an earlier test started
    (without the probe on its path) is closed first; the next question
    starts a new one."""
    release_worker(OTHER).close()
    got = answer_in(OTHER, probe, "x")
    assert got["vllm"] == OTHER and got["pid"] == release_worker(OTHER).pid
    assert answer_in(OTHER.removesuffix(".0"), probe, "y")["pid"] == got["pid"]
    release_worker(OTHER).close()


# -- the LMCache probe: the same kind of worker, in this Python ----------------------

def test_the_lmcache_probe_answers_from_one_process_and_is_restarted_once_killed(qwen_a100):
    """Two layouts from one probe process (torch and vLLM imported once);
    the probe killed between them is restarted and answers the same; its
    answers equal a fresh probe's (the file run as a one-shot command)."""
    import tempfile

    from kvexplore.connectors.lmcache_layout import (
        PROBE,
        _candidates,
        _request,
        lmcache_layout,
        lmcache_package,
        probe_worker,
    )
    from kvexplore.editing.lmcache import lmcache_release

    release = lmcache_release(None)
    first = lmcache_layout(qwen_a100, lmcache=release)
    pid = probe_worker().pid
    assert pid is not None
    second = lmcache_layout(qwen_a100, lmcache=release, chunk_size=544)
    assert probe_worker().pid == pid  # the same process answered both
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    again = lmcache_layout(qwen_a100, lmcache=release, chunk_size=1088)
    assert probe_worker().pid not in (None, pid)
    # a one-shot probe process (no worker) answers exactly as the worker did
    with tempfile.TemporaryDirectory() as folder:
        req = os.path.join(folder, "request.pkl")
        with open(req, "wb") as f:
            pickle.dump(_request(qwen_a100, _candidates(qwen_a100, 1088), None, "default"), f)
        package = lmcache_package(release.version)
        done = subprocess.run([sys.executable, str(PROBE), req, folder, str(package)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(os.path.join(folder, package.name + ".pkl"), "rb") as f:
            fresh = pickle.load(f)["ok"]
    from kvexplore.memo import per_plan

    key = ("lmcache_layout", release.version, 1088, None, "default")
    assert per_plan(qwen_a100, key, lambda: None) == fresh  # what `again` was built from
    # chunks of 256 tokens are no multiple of the 544-token block; 544 and 1,088 are
    assert (first.accepted, second.accepted, again.accepted) == (False, True, True)
    probe_worker().close()
    assert probe_worker().pid is None


def test_the_lmcache_probe_ends_with_a_killed_parent(tmp_path):
    """The parent asks the probe a question of no release (the probe starts,
    imports torch and vLLM, answers) and is killed."""
    request = tmp_path / "request.pkl"
    request.write_bytes(pickle.dumps({}))
    _killed_parent_leaves_no_worker(f"""
        import json
        from kvexplore.connectors.lmcache_layout import probe_worker
        probe_worker().request({{"request": {str(request)!r}, "out": {str(tmp_path)!r},
                                 "releases": []}})
        print(json.dumps({{"pid": probe_worker().pid}}), flush=True)
        """)
