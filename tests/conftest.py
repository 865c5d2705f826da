"""Shared test setup: headless matplotlib, quiet vLLM logs, GPU marker."""

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
