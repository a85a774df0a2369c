#!/usr/bin/env bash
# A build without MPI, started as the ranks of an mpirun job, refuses with one error line each
# and writes nothing, instead of every rank training alone into the same --model-dir. Uses the
# build that scripts/fuzz.sh configures without MPI (build-fuzz: clang, ASan + UBSan, so a leak
# on that path fails too) and builds its command-line tool there. Run by .ci/run after fuzz.sh.
#   bash scripts/without_mpi.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build-fuzz/CMakeCache.txt ] || { echo "error: run scripts/fuzz.sh first (it configures build-fuzz)" >&2; exit 1; }
grep -q '^TRANSFORMER_MPI:BOOL=OFF' build-fuzz/CMakeCache.txt ||
  { echo "error: build-fuzz is configured with MPI" >&2; exit 1; }
cmake --build build-fuzz -j"$(nproc)" --target transformer_cli >/dev/null
bin=$PWD/build-fuzz/transformer
"$bin" --version | grep -qx 'MPI: no' || { echo "error: $bin --version does not say 'MPI: no'" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 40); do echo "$((4 + i % 20)) $((5 + i % 7)) 6"; done >"$work/train.src"
cp "$work/train.src" "$work/train.tgt"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bin" train --preset tiny \
  --vocab 32 --ids --train-src "$work/train.src" --train-tgt "$work/train.tgt" \
  --model-dir "$work/model" --max-steps 2 >"$work/out" 2>"$work/err" || status=$?
refusals=$(grep -c '^error: this transformer was built without MPI, so it cannot join an mpirun job' "$work/err" || true)
if [ "$status" -eq 0 ] || [ "$refusals" -ne 2 ] || [ -e "$work/model" ] || grep -q 'Sanitizer' "$work/err"; then
  echo "error: a build without MPI under mpirun: exit $status, $refusals refusal lines (2 wanted)," \
    "model directory $([ -e "$work/model" ] && echo written || echo absent); its stderr:" >&2
  cat "$work/err" >&2
  exit 1
fi
echo "without MPI: both ranks refused (exit $status), nothing written"
