#!/usr/bin/env bash
# The whole kvexplore test suite, set-up included, on a fresh machine that has
# python3 (>= 3.11) and pip. Re-running is cheap: pip reuses what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# tests/test_browser.py drives Debian's Chromium (/usr/bin/chromium) with
# Playwright; without it that test fails and says how to install it.
if [ ! -x /usr/bin/chromium ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
  else
    echo "test.sh: cannot install chromium (needs apt-get, and root or sudo);" \
      "tests/test_browser.py will fail" >&2
  fi
fi
# The test extra includes the playwright package; never `playwright install`
# (it downloads browsers): the browser test uses Debian's chromium.
python3 -m pip install -q -e ".[test]"
export MPLBACKEND=Agg
exec python3 -m pytest -q -p no:cacheprovider \
  --doctest-modules tests kvexplore notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg "$@"
