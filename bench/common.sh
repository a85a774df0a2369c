# Sourced by the bench/run_*.sh scripts: the set-up they all share. Expects $build (build
# directory) and fail() to be defined by the caller.
#
#   bench_prepare TARGET [PACKAGE...]   installs Debian's PACKAGEs, builds TARGET with benchmarks
#                                       on, and installs the peers as users install them (PyPI's
#                                       wheels pinned in bench/peers.txt, outside the repository:
#                                       bench/peers.sh); sets bench_bin to the built program,
#                                       python to the peers' python and peer_versions.
bench_prepare() {
  local target=$1
  shift
  bash scripts/bootstrap.sh "$@"
  [ -f "$build/CMakeCache.txt" ] || bash scripts/build.sh >/dev/null
  if grep -q '^TRANSFORMER_BENCH:BOOL=OFF' "$build/CMakeCache.txt"; then
    cmake -S . -B "$build" -DTRANSFORMER_BENCH=ON >/dev/null
  fi
  cmake --build "$build" --target "$target" -j2 >/dev/null 2>&1 ||
    { cmake -S . -B "$build" >/dev/null && cmake --build "$build" --target "$target" -j2 >/dev/null; } ||
    fail "building $target failed"
  bench_bin="$build/bench/$target"
  source bench/peers.sh
  peers_prepare || fail "the peers could not be installed (bench/peers.sh)"
  python=$peer_python
}
