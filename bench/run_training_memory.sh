#!/usr/bin/env bash
# Training's memory curve: trains the small preset on the quickstart corpus for STEPS steps
# (batches of 4096 tokens, no validation or snapshots on the way) and prints the resident memory
# every 50 steps, read from the `rss_mb` field train.log.jsonl records at each log line. Planned
# memory grows with the first epoch's largest batches and then stays flat.
#
# usage: bench/run_training_memory.sh [STEPS]   (default 1000; needs `bash scripts/quickstart.sh`
#        to have prepared out/corpus and out/quickstart/vocab.spm, or CORPUS=DIR VOCAB=FILE)
# env:   BUILD_DIR (build)  CORPUS (out/corpus)  VOCAB (out/quickstart/vocab.spm)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
build=${BUILD_DIR:-build}
corpus=${CORPUS:-out/corpus}
vocab=${VOCAB:-out/quickstart/vocab.spm}
[ -f "$corpus/train.en" ] && [ -f "$vocab" ] ||
  { echo "error: no corpus ($corpus/train.en) or vocabulary ($vocab); run scripts/quickstart.sh first" >&2; exit 1; }
[ -x "$build/transformer" ] || bash scripts/build.sh >/dev/null
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
"$build/transformer" train --preset small --vocabs "$vocab" --train-src "$corpus/train.en" \
  --train-tgt "$corpus/train.es" --model-dir "$run/model" --batch-tokens 4096 \
  --max-steps "$steps" --log-every 50 --valid-every 0 --save-every 1000000 --keep 0 2>/dev/null >&2
echo "| step | resident memory (MB) |"
echo "|---:|---:|"
/usr/bin/python3 - "$run/model/train.log.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    event = json.loads(line)
    if event.get("event") == "train":
        print(f"| {event['step']} | {event['rss_mb']:.0f} |")
PY
