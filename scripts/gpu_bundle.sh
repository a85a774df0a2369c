#!/usr/bin/env bash
# Packs this build for a GPU machine that has CUDA 13 but none of Debian's libraries (oneDNN,
# SentencePiece, ICU, Open MPI, ...): build/transformer, build/tests/transformer_tests,
# build/bench/train_bench and build/bench/decode_bench at
# their build-tree paths, plus every shared library `ldd` lists except glibc's and CUDA's own
# (the GPU machine has cudart / cuBLAS 13), under build/gpu-lib; one xz-compressed tar.
# scripts/gpu_check.sh unpacks it into the repository root there and runs the GPU checks.
#   bash scripts/gpu_bundle.sh [OUT]    (default .gpu/bundle.tar.xz; .gpu/ is git-ignored)
# Build first for the GPU machine's CPU as well as this one's, e.g.
#   cmake -S . -B build -DTRANSFORMER_NATIVE=OFF \
#     -DCMAKE_CXX_FLAGS="-march=x86-64-v4 -mavx512bf16 -mavx512vnni"
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu/bundle.tar.xz}
mkdir -p "$(dirname "$out")"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/build/bench" "$stage/build/gpu-lib"
cp build/transformer "$stage/build/"
# The commit the binaries were built from (the GPU machine's copy of .git may be older).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests CMakeLists.txt || echo +changes)" \
  >"$stage/build/BUNDLE_COMMIT"
cp build/tests/transformer_tests "$stage/build/tests/"
cp build/bench/train_bench build/bench/decode_bench "$stage/build/bench/"
for binary in build/transformer build/tests/transformer_tests build/bench/train_bench \
  build/bench/decode_bench; do
  ldd "$binary" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|/libcu(da|dart|blas|blasLt)\.so' |
    while read -r library; do cp -Ln "$library" "$stage/build/gpu-lib/" 2>/dev/null || true; done
done
strip --strip-unneeded "$stage"/build/transformer "$stage"/build/tests/transformer_tests \
  "$stage"/build/bench/train_bench "$stage"/build/bench/decode_bench \
  "$stage"/build/gpu-lib/* 2>/dev/null || true
tar -C "$stage" -cJf "$out" .
du -h "$out"
