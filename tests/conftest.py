"""Shared test setup: headless matplotlib, quiet vLLM logs, GPU marker, and
the plans many test modules read (planned once per session)."""

import logging
import os

import matplotlib

matplotlib.use("Agg")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
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
