#!/usr/bin/env bash
# Load test of `transformer serve` (bench/serve_load.py): 1, 8, 32 and 128 concurrent clients
# sending Acts verses one per request to the quickstart model, batched and unbatched server,
# next to offline `translate` of the same verses in the same run. Loopback only; every level is
# bounded in requests and seconds. Writes bench/results/serve_load.{md,json}.
#
# usage: bench/run_serve_load.sh [REQUESTS]   (default 256 per level; needs the quickstart's
#        model and corpus: `bash scripts/quickstart.sh`, or MODEL=DIR VERSES=FILE)
# env:   BUILD_DIR (build)  MODEL (out/quickstart-8/averaged)  VERSES (out/corpus/test.en)
#        THREADS (2)  LEVELS (1,8,32,128)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
model=${MODEL:-out/quickstart-8/averaged}
verses=${VERSES:-out/corpus/test.en}
[ -f "$model/model.safetensors" ] && [ -f "$verses" ] ||
  { echo "error: no model ($model) or verses ($verses); run scripts/quickstart.sh first" >&2; exit 1; }
[ -x "$build/transformer" ] || bash scripts/build.sh >/dev/null
mkdir -p bench/results
/usr/bin/python3 bench/serve_load.py --cli "$build/transformer" --model "$model" \
  --verses "$verses" --requests "${1:-256}" --threads "${THREADS:-2}" \
  --levels "${LEVELS:-1,8,32,128}" --out bench/results/serve_load
