#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of outside input (libFuzzer, clang, ASan + UBSan):
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
# SECONDS per target (default 30); targets default to all of: safetensors ctranslate2 config
# id_line sentencepiece bleu serve_request. Seeds come from fuzz/corpus/<target>/ (committed); what the
# fuzzer learns goes to build-fuzz/corpus/<target>/, crashes to build-fuzz/crashes/<target>/.
# Exits non-zero when a target finds a crash (the input is kept there to reproduce:
# build-fuzz/fuzz/<target>_fuzz <input>).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors ctranslate2 config id_line sentencepiece bleu serve_request)
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "error: SECONDS must be a whole number, not '$seconds'" >&2; exit 2; }
bash scripts/bootstrap.sh clang libclang-rt-dev libomp-dev
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g -Wno-pass-failed"
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DTRANSFORMER_FUZZ=ON -DTRANSFORMER_TESTS=OFF -DTRANSFORMER_BENCH=OFF -DTRANSFORMER_MPI=OFF \
  -DTRANSFORMER_CUDA=OFF -DTRANSFORMER_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(printf '%s_fuzz ' "${targets[@]}")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  echo "== $t: ${seconds} s"
  if ! build-fuzz/fuzz/${t}_fuzz -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=20 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/crashes/$t/" \
      "build-fuzz/corpus/$t" "fuzz/corpus/$t" 2>"build-fuzz/$t.log"; then
    failed+=("$t")
    tail -40 "build-fuzz/$t.log"
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|cov: " "build-fuzz/$t.log" | tail -3
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "error: fuzzing found crashes in: ${failed[*]} (inputs in build-fuzz/crashes/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, no crash"
