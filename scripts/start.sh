#!/usr/bin/env bash
# Install kvexplore and open the tour notebook (default model Qwen/Qwen3.5-0.8B)
# in JupyterLab. Extra arguments go to JupyterLab (e.g. --port 8899 --no-browser).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
root=()
if [ "$(id -u)" -eq 0 ]; then root=(--allow-root); fi
exec python3 -m jupyterlab notebooks/01-tour.ipynb "${root[@]}" "$@"
