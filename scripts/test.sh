#!/usr/bin/env bash
# The whole kvexplore test suite, set-up included, on a fresh machine that has
# python3 (>= 3.11) and pip. Re-running is cheap: pip reuses what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[test]"
export MPLBACKEND=Agg
exec python3 -m pytest -q -p no:cacheprovider \
  tests notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg "$@"
