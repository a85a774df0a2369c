#!/usr/bin/env bash
# Runs CTest in BUILD_DIR (further arguments go to ctest), then lists every skipped test and
# skipped part of a test with its reason, and fails on a skip this machine should not need
# (scripts/check_skips.py against tests/allowed_skips.txt: no GPU, a CPU feature it lacks, ...).
# First installs what the suite's optional tests need, so that none of them skips for want of a
# package: chromium, its driver and Selenium (serve's web page), the SWORD Bible modules
# (prepare_corpus), PyTorch and numpy (the fixture generators, re-run and compared). Used by
# scripts/test.sh and scripts/sanitize.sh.
#   bash scripts/run_ctest.sh BUILD_DIR [CTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
shift
bash scripts/bootstrap.sh chromium chromium-driver python3-selenium \
  diatheke python3-sword sword-text-web sword-text-sparv python3-torch python3-numpy
# CTest runs tests side by side (-j2 on two cores), each with OpenMP threads; libgomp's waiting
# threads spin at every barrier by default and take the cores the other test needs: the reversal
# training test took 40 s alone, 80 s beside a copy of itself with passive waits, 217 s without.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
junit="$PWD/$build/ctest-junit.xml"
rm -f "$junit"
status=0
# Whole outputs in the JUnit file (CTest keeps 1 KB of a passed test's by default): the reasons
# of skips are read from them.
ctest --test-dir "$build" --output-on-failure --output-junit "$junit" \
  --test-output-size-passed 10485760 "$@" || status=$?
if [ -f "$junit" ]; then
  /usr/bin/python3 scripts/check_skips.py "$junit" || status=1
else
  echo "error: ctest wrote no $junit" >&2
  status=1
fi
exit "$status"
