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
start=$SECONDS
python3 -m pip install -q -e ".[test]" -c scripts/default-release.txt
install_s=$((SECONDS - start))
export MPLBACKEND=Agg
# Importing vLLM imports humming-kernels, whose humming/ops/utils.py starts two
# background processes building an NVRTC binary and a kernel launcher for
# later GPU use; no test runs a GPU kernel through vLLM. This variable, read by
# humming/ops/utils.py and humming/utils/cpu.py, keeps them from starting in
# every process of the run (a kernel that needs them would build them on first
# use).
export HUMMING_DISABLE_PARALLEL_BUILD=1
status=0
# Two lines of work, one per core (each is one single-threaded Python):
# 2. in the background, the release tests (marker `release`) on every other
#    release of the window, each in its own environment, created with uv on
#    first use (kvexplore envs); each release's output is printed at the end.
default=$(python3 -c "import importlib.metadata as m; print(m.version('vllm'))")
releases=$(python3 -c "from kvexplore.planning.release import WINDOW_RELEASES as w; print(*w)")
logs=$(mktemp -d)
(
  for release in $releases; do
    [ "$release" = "$default" ] && continue
    {
      release_start=$SECONDS
      echo "== vLLM $release: release tests in its own environment"
      if python=$(python3 -m kvexplore envs "$release" --create --python); then
        # vLLM caches what it learns of model classes in files named alike
        # across releases: each release keeps its own
        VLLM_CACHE_ROOT="$(dirname "$(dirname "$python")")/vllm-cache" \
          "$python" -m pytest -q -p no:cacheprovider -m release \
          $(grep -l "mark.release" tests/test_*.py) && echo 0 > "$logs/$release.rc" \
          || echo 1 > "$logs/$release.rc"
      else
        echo 1 > "$logs/$release.rc"
      fi
      echo "== vLLM $release: $((SECONDS - release_start)) s (environment check included)"
    } > "$logs/$release.log" 2>&1
  done
) &
chain=$!
# 1. The whole suite (pytest, doctests, notebooks under nbval) on the default
#    release, the newest of the window that installs from the package index.
suite_start=$SECONDS
python3 -m pytest -q -p no:cacheprovider \
  --doctest-modules tests kvexplore notebooks --nbval --nbval-sanitize-with notebooks/sanitize.cfg "$@" \
  || status=$?
suite_s=$((SECONDS - suite_start))
wait "$chain" || true
for release in $releases; do
  [ "$release" = "$default" ] && continue
  cat "$logs/$release.log" 2>/dev/null || echo "== vLLM $release: no output"
  [ "$(cat "$logs/$release.rc" 2>/dev/null)" = "0" ] || status=1
done
rm -rf "$logs"
echo "== seconds: install $install_s, suite on vLLM $default $suite_s," \
  "both lines $((SECONDS - suite_start)) (each release's time is above), whole command $SECONDS"
exit $status
