"""Shared test setup: headless matplotlib, quiet vLLM logs and progress bars,
a fresh answer store per test, GPU marker, and
the plans many test modules read (planned once per session)."""

import logging
import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TQDM_DISABLE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Freeze the heap once the session's tests are done.

    A session ends holding millions of live objects (every cached plan keeps
    vLLM's model built on the meta device); pytest's closing garbage
    collections and the interpreter's last one would scan them all to free
    nothing the process's exit does not free anyway.  The young generations
    are collected first, so what the last tests left behind is still
    finalized (and an exception raised there still reported); what is frozen
    is only never scanned again."""
    import gc

    gc.collect(1)
    gc.freeze()


@pytest.fixture(autouse=True)
def answer_store_per_test(tmp_path_factory, monkeypatch):
    """Every test (and the command lines it runs) gets an empty answer store
    of its own: no answer carries over from another test or from the user's."""
    from kvexplore.paths import STORE_DIR_VARIABLE

    monkeypatch.setenv(STORE_DIR_VARIABLE, str(tmp_path_factory.mktemp("answers")))


QWEN = "Qwen/Qwen3.5-0.8B"


@pytest.fixture(scope="session")
def qwen_a100():
    """Qwen3.5-0.8B on an A100, block 544, with 16 blocks (a cache small enough
    to allocate; the default plan is sized for the deployment)."""
    import kvexplore

    return kvexplore.plan(QWEN, gpu="A100", num_blocks=16)


@pytest.fixture(scope="session")
def qwen_a100_flashinfer():
    """The same on FLASHINFER: attention kernel block 32, 17 kernel pages."""
    import kvexplore

    return kvexplore.plan(QWEN, gpu="A100", attention_backend="FLASHINFER", num_blocks=16)
