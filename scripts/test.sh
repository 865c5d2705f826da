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
default=$(python3 -c "import importlib.metadata as m; print(m.version('vllm'))")
releases=$(python3 -c "from kvexplore.planning.release import WINDOW_RELEASES as w; print(*w)")
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The work, as items two workers (one per core, each a single-threaded
# Python) take in this order, each taking the next item no one has taken when
# it finishes one, so both cores stay busy to the end whichever item runs
# long (a release whose environment uv creates on first use, say):
# - tests-1, tests-2: pytest on the default release (the newest of the window
#   that installs from the package index) in two parts of about equal time
#   (the test files before test_models.py, then the rest and the
#   doctests), so that no item is much longer than the others;
# - release-R: the release tests (marker `release`) on every other release R
#   of the window, each in its own environment (kvexplore envs);
# - notebooks-1, notebooks-2, notebooks-3: the notebooks under nbval on the
#   default release, in three parts of about equal time (01-07, 08-11 and 12
#   on; notebook 11 starts the other releases' processes, 15 the LMCache
#   probe), so that the item a worker takes last is a short one.
items="tests-1 tests-2"
for release in $releases; do
  [ "$release" = "$default" ] || items="$items release-$release"
done
items="$items notebooks-1 notebooks-2 notebooks-3"
tests_1=() tests_2=()
for file in tests/test_*.py; do
  if [[ "$file" < tests/test_models.py ]]; then tests_1+=("$file"); else tests_2+=("$file"); fi
done
nbval=(--nbval --nbval-sanitize-with notebooks/sanitize.cfg)
notebooks_1=() notebooks_2=() notebooks_3=()
for notebook in notebooks/*.ipynb; do
  case "${notebook##*/}" in
    0[1-7]-*) notebooks_1+=("$notebook") ;;
    0[89]-*|1[01]-*) notebooks_2+=("$notebook") ;;
    *) notebooks_3+=("$notebook") ;;
  esac
done

run_item() {
  case "$1" in
    tests-1)
      # the 15 slowest tests are listed: where the item's time goes
      python3 -m pytest -q -p no:cacheprovider --durations=15 "${tests_1[@]}" "${args[@]}" ;;
    tests-2)
      python3 -m pytest -q -p no:cacheprovider --durations=15 --doctest-modules \
        "${tests_2[@]}" kvexplore "${args[@]}" ;;
    notebooks-1)
      python3 -m pytest -q -p no:cacheprovider "${nbval[@]}" "${notebooks_1[@]}" "${args[@]}" ;;
    notebooks-2)
      python3 -m pytest -q -p no:cacheprovider "${nbval[@]}" "${notebooks_2[@]}" "${args[@]}" ;;
    notebooks-3)
      python3 -m pytest -q -p no:cacheprovider "${nbval[@]}" "${notebooks_3[@]}" "${args[@]}" ;;
    release-*)
      local release=${1#release-} python
      python=$(python3 -m kvexplore envs "$release" --create --python) || return 1
      # vLLM caches what it learns of model classes in files named alike
      # across releases: each release keeps its own
      VLLM_CACHE_ROOT="$(dirname "$(dirname "$python")")/vllm-cache" \
        "$python" -m pytest -q -p no:cacheprovider -m release \
        $(grep -l "mark.release" tests/test_*.py) ;;
  esac
}

worker() {
  local item start rc
  for item in $items; do
    mkdir "$logs/$item.taken" 2>/dev/null || continue  # atomic: one worker per item
    start=$SECONDS
    rc=0
    run_item "$item" > "$logs/$item.log" 2>&1 || rc=$?
    # pytest's 5 is "no test collected": expected where arguments select none
    [ "$rc" = 5 ] && [ "${#args[@]}" -gt 0 ] && rc=0
    echo "$rc" > "$logs/$item.rc"
    echo "$item $((SECONDS - start))" >> "$logs/seconds"
    {
      flock 9
      echo "== $item: exit $rc after $((SECONDS - start)) s ($((SECONDS - lines_start)) s into both lines)"
      cat "$logs/$item.log"
    } 9>"$logs/print.lock"
  done
}

args=("$@")
status=0
lines_start=$SECONDS
worker &
first=$!
worker || true
wait "$first" || true
for item in $items; do
  [ "$(cat "$logs/$item.rc" 2>/dev/null)" = "0" ] || { echo "== $item failed"; status=1; }
done
echo "== seconds: install $install_s, $(sort -k2 -nr "$logs/seconds" | tr '\n' ',' | sed 's/,$//; s/,/, /g')," \
  "both lines $((SECONDS - lines_start)) (default release vLLM $default), whole command $SECONDS"
exit $status
