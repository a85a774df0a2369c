#!/usr/bin/env bash
# Builds CTranslate2 4.x from a source checkout (with its third_party/spdlog, cpu_features and
# cxxopts submodules present) against Debian's oneDNN 2.6. The comparisons now run CTranslate2's
# PyPI wheel (bench/peers.sh); this remains to reproduce the results before 2026-11-28, which
# ran a CTranslate2 built so. Nothing of CTranslate2 is part of this repository.
#   bash bench/build_ctranslate2.sh SRC PREFIX    (about 10 minutes on 2 cores)
# Its oneDNN-3-only Conv1D code (unused by translation models) is compiled out, the one change
# its sources need for Debian 12.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 CTRANSLATE2_SRC INSTALL_PREFIX" >&2; exit 2; }
src=$(realpath "$1"); prefix=$(realpath -m "$2")
for sub in spdlog cpu_features cxxopts; do
  [ -f "$src/third_party/$sub/CMakeLists.txt" ] ||
    { echo "error: $src/third_party/$sub is empty (CTranslate2's submodules are needed)" >&2; exit 1; }
done
bash "$(dirname "$0")/../scripts/bootstrap.sh" libdnnl-dev sentencepiece
conv="$src/src/ops/conv1d_cpu.cc"
if grep -q '^#ifdef CT2_WITH_DNNL' "$conv"; then
  sed -i 's|^#ifdef CT2_WITH_DNNL|#if defined(CT2_WITH_DNNL) \&\& 0  // Debian oneDNN 2.6 lacks the v3 API|' "$conv"
fi
build="$prefix/build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DWITH_MKL=OFF -DWITH_DNNL=ON \
  -DOPENMP_RUNTIME=COMP -DBUILD_CLI=ON -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" >/dev/null
echo "installed $prefix/bin/ct2-translator (run it with LD_LIBRARY_PATH=$prefix/lib)"
