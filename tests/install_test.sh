#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then a program outside the project built against
# it with find_package(transformer) (tests/install_consumer/), which must load a model, count
# its parameters as `transformer info` does and translate as `transformer translate` does; the
# installed binary and, where it was built, the Python module must run too.
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
count=$("$work/prefix/bin/transformer" info --model "$model" |
        awk '/^parameters:/ { gsub(",", "", $2); print "parameters: " $2 }')
translation=$(echo "3 4 5 6" | "$work/prefix/bin/transformer" translate --model "$model" --ids --beam 1)
expected=$(printf '%s\ntranslation: %s' "$count" "$translation")
echo "consumer: $got"
echo "commands: $expected"
[ -n "$count" ] && [ "$got" = "$expected" ] ||
  { echo "error: the consumer's answers differ from the commands'" >&2; exit 1; }
"$work/prefix/bin/transformer" --version | head -1
module=$(ls "$work"/prefix/lib/python3/dist-packages/transformer_cpp*.so 2>/dev/null || true)
if [ -n "$module" ]; then
  PYTHONPATH="$work/prefix/lib/python3/dist-packages" /usr/bin/python3 -c \
    'import transformer_cpp; print("python module", transformer_cpp.__version__)'
fi
