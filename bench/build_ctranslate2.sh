#!/usr/bin/env bash
# Builds CTranslate2 4.x from a source checkout against Debian's oneDNN 2.6. Nothing of
# CTranslate2 is part of this repository.
#
#   bash bench/build_ctranslate2.sh SRC PREFIX          (CPU; about 10 minutes on 2 cores)
#     The comparisons on CPUs now run CTranslate2's PyPI wheel (bench/peers.sh); this remains to
#     reproduce the results before 2026-11-28, which ran a CTranslate2 built so. Needs SRC's
#     third_party/spdlog, cpu_features and cxxopts submodules.
#
#   bash bench/build_ctranslate2.sh --cuda SRC PREFIX   (CUDA; about 10 minutes on 2 cores)
#     CTranslate2's side of the GPU decoding benchmark (scripts/gpu_check.sh). Its wheels load
#     CUDA 12's cuBLAS, which a CUDA 13 machine lacks, so its sources are built here with nvcc 13
#     for CT2_CUDA_ARCH (default 9.0: H100 / H200), without cuDNN (translation models need none)
#     or its command-line clients, and bench/ct2_decode_peer.cpp is compiled against the result
#     into PREFIX/bin/ct2_decode_peer (finding PREFIX/lib by its rpath). scripts/gpu_bundle.sh
#     packs PREFIX when CT2_CUDA_PREFIX names it. Needs SRC's spdlog and cpu_features submodules.
#
# Its oneDNN-3-only Conv1D code (unused by translation models) is compiled out, the one change
# its sources need for Debian 12. For CUDA 13 (whose CCCL 3 removed thrust::identity and
# cub::FpLimits) two more: the dequantisation's identity functor and the top-k's lowest value
# come from libcu++ (cuda::std::identity, cuda::std::numeric_limits<T>::lowest()), and its C++
# files, which include Thrust, find it where CUDA 13 keeps it (include/cccl, which only nvcc
# searches by itself).
set -euo pipefail
cuda=0
if [ "${1:-}" = --cuda ]; then cuda=1; shift; fi
[ $# -eq 2 ] || { echo "usage: $0 [--cuda] CTRANSLATE2_SRC INSTALL_PREFIX" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=$(realpath "$1"); prefix=$(realpath -m "$2")
submodules="spdlog cpu_features cxxopts"
[ $cuda = 1 ] && submodules="spdlog cpu_features"
for sub in $submodules; do
  [ -f "$src/third_party/$sub/CMakeLists.txt" ] ||
    { echo "error: $src/third_party/$sub is empty (CTranslate2's submodules are needed)" >&2; exit 1; }
done
bash "$here/../scripts/bootstrap.sh" libdnnl-dev sentencepiece
conv="$src/src/ops/conv1d_cpu.cc"
if grep -q '^#ifdef CT2_WITH_DNNL' "$conv"; then
  sed -i 's|^#ifdef CT2_WITH_DNNL|#if defined(CT2_WITH_DNNL) \&\& 0  // Debian oneDNN 2.6 lacks the v3 API|' "$conv"
fi
if [ $cuda = 1 ]; then
  nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [ -x "$nvcc" ] || { echo "error: --cuda needs nvcc (CUDA toolkit)" >&2; exit 1; }
  nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  if [ "${nvcc_version%%.*}" -ge 13 ]; then
    sed -i 's|thrust::identity<T>()|::cuda::std::identity()|' "$src/src/ops/dequantize_gpu.cu"
    grep -q '<cuda/std/functional>' "$src/src/ops/dequantize_gpu.cu" ||
      sed -i '1a #include <cuda/std/functional>' "$src/src/ops/dequantize_gpu.cu"
    sed -i 's|cub::FpLimits<T>::Lowest()|::cuda::std::numeric_limits<T>::lowest()|' "$src/src/ops/topk_gpu.cu"
    grep -q '<cuda/std/limits>' "$src/src/ops/topk_gpu.cu" ||
      sed -i '1a #include <cuda/std/limits>' "$src/src/ops/topk_gpu.cu"
    # lowest() of a type numeric_limits does not know is T(): 0, and top-k would find nothing.
    grep -q 'is_specialized' "$src/src/ops/topk_gpu.cu" ||
      sed -i 's|^  struct TopK {$|  struct TopK {\n    static_assert(::cuda::std::numeric_limits<T>::is_specialized, "lowest() of T");|' \
        "$src/src/ops/topk_gpu.cu"
    cccl=$(dirname "$(realpath "$nvcc")")/../include/cccl
    [ -d "$cccl" ] && export CPLUS_INCLUDE_PATH="$(realpath "$cccl")${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  fi
fi
build="$prefix/build"
options=(-DCMAKE_BUILD_TYPE=Release -DWITH_MKL=OFF -DWITH_DNNL=ON -DOPENMP_RUNTIME=COMP
  -DCMAKE_INSTALL_PREFIX="$prefix")
if [ $cuda = 1 ]; then
  options+=(-DWITH_CUDA=ON -DWITH_CUDNN=OFF -DCUDA_ARCH_LIST="${CT2_CUDA_ARCH:-9.0}" -DBUILD_CLI=OFF)
else
  options+=(-DBUILD_CLI=ON)
fi
cmake -S "$src" -B "$build" "${options[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" >/dev/null
if [ $cuda = 0 ]; then
  echo "installed $prefix/bin/ct2-translator (run it with LD_LIBRARY_PATH=$prefix/lib)"
  exit 0
fi
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$src/python/ctranslate2/version.py")
mkdir -p "$prefix/bin"
g++ -std=c++17 -O2 -DCTRANSLATE2_VERSION="\"$version, built from source with nvcc $nvcc_version\"" \
  -I"$prefix/include" "$here/ct2_decode_peer.cpp" -o "$prefix/bin/ct2_decode_peer" \
  -L"$prefix/lib" -lctranslate2 -Wl,-rpath,'$ORIGIN/../lib'
echo "installed $prefix/bin/ct2_decode_peer (CTranslate2 $version for CUDA ${CT2_CUDA_ARCH:-9.0})"
