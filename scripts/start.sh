#!/usr/bin/env bash
# Install kvexplore and open the tour notebook (default model Qwen/Qwen3.5-0.8B)
# in JupyterLab.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
exec python3 -m jupyterlab notebooks/01-tour.ipynb "$@"
