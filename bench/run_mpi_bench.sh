#!/usr/bin/env bash
# Data-parallel scaling on this machine (issue: MPI training): the same training, same global
# batch, as 1 process with all threads and as P MPI ranks with threads / P each, alternating,
# for the small and base presets; reports target tokens/s of each, the ratio, and what the
# gradient all-reduce costs per step (bytes per rank, seconds), from train.log.jsonl.
# Data: random token ids (vocabulary 8000, 8–40 tokens a side), so nothing needs preparing.
#
# usage: bench/run_mpi_bench.sh   env: THREADS (2) RANKS (2) STEPS (30) ROUNDS (2) BUILD_DIR (build)
# Writes bench/results/mpi.md and mpi.json. About 6 minutes on 2 cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
threads=${THREADS:-2}
ranks=${RANKS:-2}
steps=${STEPS:-30}
rounds=${ROUNDS:-2}
build=${BUILD_DIR:-build}
bin=$build/transformer
[ -x "$bin" ] || bash scripts/build.sh >/dev/null
command -v mpirun >/dev/null || { echo "error: mpirun not found (bash scripts/bootstrap.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" <<'PY'
import random, sys
r = random.Random(7)
with open(sys.argv[1] + "/d.src", "w") as s, open(sys.argv[1] + "/d.tgt", "w") as t:
    for _ in range(20000):
        for f in (s, t):
            f.write(" ".join(str(r.randint(4, 7999)) for _ in range(r.randint(8, 40))) + "\n")
PY
launcher=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks"
          -x OMP_NUM_THREADS=$((threads / ranks > 0 ? threads / ranks : 1)))
run() {  # preset mode round -> prints the run's directory
  local dir=$work/$1-$2-$3
  local args=(train --preset "$1" --vocab 8000 --ids --train-src "$work/d.src" --train-tgt "$work/d.tgt"
              --model-dir "$dir" --max-steps "$steps" --log-every 5 --save-every 0 --valid-every 0
              --batch-tokens 4096 --warmup 4000)
  if [ "$2" = single ]; then
    OMP_NUM_THREADS=$threads "$bin" "${args[@]}" >/dev/null 2>"$dir.err" || { cat "$dir.err" >&2; exit 1; }
  else
    "${launcher[@]}" "$bin" "${args[@]}" >/dev/null 2>"$dir.err" || { cat "$dir.err" >&2; exit 1; }
  fi
  echo "$dir"
}
dirs=()
for preset in small base; do
  for round in $(seq 1 "$rounds"); do
    dirs+=("$(run $preset single "$round")" "$(run $preset mpi "$round")")
  done
done
mkdir -p bench/results
/usr/bin/python3 - "$threads" "$ranks" "${dirs[@]}" <<'PY'
import json, statistics, sys, os, datetime
threads, ranks, dirs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
rows = {}
for d in dirs:
    preset, mode = os.path.basename(d).split("-")[:2]
    events = [json.loads(l) for l in open(d + "/train.log.jsonl") if '"train"' in l]
    events = events[1:]  # the first interval holds start-up
    r = rows.setdefault((preset, mode), {"tok_s": [], "reduce_s": [], "bytes": 0})
    r["tok_s"] += [e["target_tokens_per_s"] for e in events]
    r["reduce_s"] += [e.get("allreduce_seconds_per_step", 0) for e in events]
    r["bytes"] = max(r["bytes"], max((e.get("allreduce_bytes_per_step", 0) for e in events), default=0))
out, lines = [], []
lines.append(f"| preset | 1 process × {threads} threads | {ranks} ranks × {max(threads // ranks, 1)} thread(s) | ratio | all-reduce per step ({ranks} ranks) |")
lines.append("|---|---:|---:|---:|---|")
for preset in ("small", "base"):
    one = statistics.median(rows[(preset, "single")]["tok_s"])
    many = statistics.median(rows[(preset, "mpi")]["tok_s"])
    reduce_s = statistics.median(rows[(preset, "mpi")]["reduce_s"])
    mib = rows[(preset, "mpi")]["bytes"] / 2**20
    out.append({"preset": preset, "single_tok_s": one, "mpi_tok_s": many, "ratio": many / one,
                "allreduce_seconds_per_step": reduce_s, "allreduce_mib_per_step": mib})
    lines.append(f"| {preset} | {one:.0f} target tok/s | {many:.0f} | {many / one:.2f}× | {mib:.0f} MiB, {reduce_s:.3f} s |")
stamp = datetime.date.today().isoformat()
text = f"MPI data parallelism on this machine ({stamp}, {os.cpu_count()} cores; global batch 4096 tokens):\n\n" + "\n".join(lines) + "\n"
open("bench/results/mpi.md", "w").write(text)
json.dump(out, open("bench/results/mpi.json", "w"), indent=1)
print(text)
PY
