# Sourced by the bench/run_*.sh scripts: the set-up they all share. Expects $build (build
# directory) and fail() to be defined by the caller.
#
#   bench_prepare TARGET [PACKAGE...]   installs Debian's PyTorch (+ numpy and PACKAGEs), builds
#                                       TARGET with benchmarks on, and makes sure PyTorch runs on
#                                       OpenBLAS; sets bench_bin to the built program.
# env: BENCH_NO_INSTALL=1 fails instead of installing OpenBLAS for the PyTorch peer.
bench_prepare() {
  local target=$1
  shift
  bash scripts/bootstrap.sh python3-torch python3-numpy "$@"
  [ -f "$build/CMakeCache.txt" ] || bash scripts/build.sh >/dev/null
  if grep -q '^TRANSFORMER_BENCH:BOOL=OFF' "$build/CMakeCache.txt"; then
    cmake -S . -B "$build" -DTRANSFORMER_BENCH=ON >/dev/null
  fi
  cmake --build "$build" --target "$target" -j2 >/dev/null 2>&1 ||
    { cmake -S . -B "$build" >/dev/null && cmake --build "$build" --target "$target" -j2 >/dev/null; } ||
    fail "building $target failed"
  bench_bin="$build/bench/$target"

  # Debian's torch does its dense GEMMs through libblas.so.3; when that alternative is the netlib
  # reference BLAS, PyTorch runs ~50x below its real speed (measured: 4 GFLOP/s), which would
  # make the comparison meaningless. libtorch1.13 recommends OpenBLAS; install it as a user would.
  local blas
  blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
  if [[ -z "$blas" || "$blas" == */blas/libblas.so.3* ]]; then
    if [[ "${BENCH_NO_INSTALL:-0}" == 1 || $(id -u) != 0 ]]; then
      fail "PyTorch would use the netlib reference BLAS ($blas); install libopenblas0-openmp"
    fi
    echo "installing libopenblas0-openmp (PyTorch's BLAS; the netlib reference is ~50x slower)" >&2
    apt-get install -y -q libopenblas0-openmp >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q libopenblas0-openmp >/dev/null; } ||
      fail "could not install libopenblas0-openmp"
  fi
}
