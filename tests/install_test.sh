#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then a program outside the project built against
# it with find_package(transformer) (tests/install_consumer/), which must load a model and count
# its parameters as `transformer info` does; the installed binary must run too.
#   install_test.sh BUILD_DIR MODEL_FILE
set -euo pipefail
build=$1
model=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in bin/transformer include/transformer/io/model_file.h \
         lib/cmake/transformer/transformerConfig.cmake lib/cmake/transformer/transformerTargets.cmake; do
  [ -e "$work/prefix/$f" ] || { echo "error: cmake --install did not write $f" >&2; exit 1; }
done
ls "$work"/prefix/lib/libtransformer.a >/dev/null

cmake -S "$here/install_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/consumer" -j2 >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }

got=$("$work/consumer/consumer" "$model")
expected=$("$work/prefix/bin/transformer" info --model "$model" |
           awk '/^parameters:/ { gsub(",", "", $2); print "parameters: " $2 }')
echo "consumer: $got; transformer info: $expected"
[ -n "$expected" ] && [ "$got" = "$expected" ] ||
  { echo "error: the consumer's count differs from transformer info's" >&2; exit 1; }
"$work/prefix/bin/transformer" --version | head -1
