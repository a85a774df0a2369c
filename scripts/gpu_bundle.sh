#!/usr/bin/env bash
# Packs this build for a GPU machine that has CUDA 13 but none of Debian's libraries (oneDNN,
# SentencePiece, ICU, Open MPI, ...): build/transformer, build/tests/transformer_tests,
# build/bench/train_bench and build/bench/decode_bench at
# their build-tree paths, plus every shared library `ldd` lists except glibc's and CUDA's own
# (the GPU machine has cudart / cuBLAS 13), under build/gpu-lib, and Open MPI's runtime under
# build/openmpi (scripts/pack_openmpi.sh); one xz-compressed tar.
# scripts/gpu_check.sh unpacks it into the repository root there and runs the GPU checks.
#   bash scripts/gpu_bundle.sh [OUT]    (default .gpu/bundle.tar.xz; .gpu/ is git-ignored)
# With CT2_CUDA_PREFIX naming a CTranslate2 built by `bench/build_ctranslate2.sh --cuda`, its
# library and bench/ct2_decode_peer go in too (build/ct2/), and gpu_check runs the decoding
# comparison against CTranslate2 on the GPU; without it those steps say they were skipped.
# Build first for the GPU machine's CPU as well as this one's, e.g.
#   cmake -S . -B build -DTRANSFORMER_NATIVE=OFF \
#     -DCMAKE_CXX_FLAGS="-march=x86-64-v4 -mavx512bf16 -mavx512vnni"
set -euo pipefail
[ -z "${CT2_CUDA_PREFIX:-}" ] || CT2_CUDA_PREFIX=$(realpath "$CT2_CUDA_PREFIX")
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
binaries="build/transformer build/tests/transformer_tests build/bench/train_bench build/bench/decode_bench"
if [ -n "${CT2_CUDA_PREFIX:-}" ]; then
  [ -x "$CT2_CUDA_PREFIX/bin/ct2_decode_peer" ] ||
    { echo "error: $CT2_CUDA_PREFIX/bin/ct2_decode_peer is missing (bench/build_ctranslate2.sh --cuda)" >&2; exit 1; }
  mkdir -p "$stage/build/ct2/bin" "$stage/build/ct2/lib"
  cp "$CT2_CUDA_PREFIX/bin/ct2_decode_peer" "$stage/build/ct2/bin/"
  soname=$(readelf -d "$CT2_CUDA_PREFIX/lib/libctranslate2.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
  cp -L "$CT2_CUDA_PREFIX/lib/libctranslate2.so" "$stage/build/ct2/lib/$soname"
  binaries+=" $CT2_CUDA_PREFIX/bin/ct2_decode_peer"
fi
for binary in $binaries; do
  ldd "$binary" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|/libcu(da|dart|blas|blasLt)\.so|/libctranslate2\.so' |
    while read -r library; do cp -Ln "$library" "$stage/build/gpu-lib/" 2>/dev/null || true; done
done
# Open MPI's runtime (mpirun and what it loads), for the data-parallel test on the GPU
# (MpiTrain.TwoRanksOnGpusMatchOneGpuProcess): the GPU machine has no MPI of its own. A build
# with MPI needs it, or that test would only skip there.
if ldd build/transformer | grep -q libmpi; then
  command -v orterun >/dev/null ||
    { echo "error: this build has MPI but orterun is missing (apt-get install openmpi-bin)" >&2; exit 1; }
  bash scripts/pack_openmpi.sh "$stage/build/openmpi" >/dev/null
fi
strip --strip-unneeded "$stage"/build/transformer "$stage"/build/tests/transformer_tests \
  "$stage"/build/bench/train_bench "$stage"/build/bench/decode_bench \
  "$stage"/build/gpu-lib/* "$stage"/build/ct2/bin/* "$stage"/build/ct2/lib/* 2>/dev/null || true
tar -C "$stage" -cJf "$out" .
du -h "$out"
