#!/usr/bin/env bash
# Re-execute every notebook in place, in this (the pinned) environment, so the
# stored outputs nbval compares against are regenerated in one command.
set -euo pipefail
cd "$(dirname "$0")/.."
for nb in notebooks/*.ipynb; do
  echo "executing $nb"
  python3 -m jupyter nbconvert --to notebook --execute --inplace \
    --ExecutePreprocessor.timeout=600 "$nb"
done
# Drop per-cell execution timestamps so re-running changes only real outputs.
python3 - <<'PY'
import glob

import nbformat

for path in sorted(glob.glob("notebooks/*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
PY
