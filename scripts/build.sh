#!/usr/bin/env bash
# Configures and builds transformer-cpp (Release, for this machine's CPU: -march=native) into
# build/. A plain CMake build makes a portable x86-64-v3 binary instead (docs/installation.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTRANSFORMER_NATIVE=ON >/dev/null
cmake --build build -j"$(nproc)"
