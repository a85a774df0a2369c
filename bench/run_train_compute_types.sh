#!/usr/bin/env bash
# Training in bfloat16 against float32 and against PyTorch, in one run (docs/performance.md, "How we measure"):
# train_bench (one full step of the base model: zero grads, forward, label-smoothed loss,
# backward, Adam; the same fixed batch of 64 pairs × 32 + 32 positions) with --compute-type
# float32 and bfloat16, and bench/train_peer.py (PyTorch from PyPI, bench/peers.txt: the same
# step) in float32 and under its bfloat16 autocast, alternating for ROUNDS rounds. Writes
# bench/results/train_compute_types.{md,json}: the median seconds a step, target tokens/s, the
# ratio bfloat16/float32, each of ours against PyTorch at the same precision, peak RSS and the
# loss of the last step (ours start from the same weights and batch). PEER=0 leaves PyTorch out.
#
# usage: bench/run_train_compute_types.sh
# env:   ROUNDS (3) STEPS (3) WARMUP (1) OMP_NUM_THREADS (2) PEER (1)
# About 2 minutes on 2 idle cores, 6 with PyTorch. Needs a CPU with AVX512-BF16.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-3}
build=${BUILD_DIR:-build}
fail() { echo "error: $*" >&2; exit 1; }
source bench/common.sh
bench_prepare train_bench
grep -qw avx512_bf16 /proc/cpuinfo || fail "this CPU has no AVX512-BF16"
work=$(mktemp -d /tmp/train_compute_types.XXXXXX)
trap 'rm -rf "$work"' EXIT
peer=${PEER:-1}
for round in $(seq 1 "$rounds"); do
  for type in float32 bfloat16; do
    "$bench_bin" --compute-type "$type" --steps "${STEPS:-3}" --warmup "${WARMUP:-1}" >>"$work/$type.jsonl" ||
      fail "train_bench --compute-type $type failed"
  done
  if [ "$peer" = 1 ]; then
    for autocast in none bfloat16; do
      "$python" bench/train_peer.py --steps "${STEPS:-3}" --warmup "${WARMUP:-1}" \
        --autocast "$autocast" >>"$work/pytorch_$autocast.jsonl" || fail "train_peer.py failed"
    done
  fi
  echo "round $round/$rounds done" >&2
done
mkdir -p bench/results
"$python" - "$work" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" <<'PY'
import datetime, json, statistics, sys
work, cpu = sys.argv[1:3]
runs = {t: [json.loads(l) for l in open(f"{work}/{t}.jsonl") if l.strip()] for t in ("float32", "bfloat16")}
def summary(rs):
    return {"median_s": statistics.median(r["median_s"] for r in rs),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs), "loss_last": rs[0]["loss_last"],
            "each_round_s": [r["median_s"] for r in rs]}
f32, bf16 = summary(runs["float32"]), summary(runs["bfloat16"])
# The ceiling: the step's FLOPs at the bfloat16 GEMM peak measured in the same processes.
bf16["gflop"] = runs["bfloat16"][0]["gflop"]
bf16["gflops"] = statistics.median(r["gflops"] for r in runs["bfloat16"])
bf16["gemm_peak_gflops"] = statistics.median(r["bfloat16_gemm_peak_gflops"] for r in runs["bfloat16"])
bf16["step_s_at_gemm_peak"] = bf16["gflop"] / bf16["gemm_peak_gflops"]
def torch_summary(autocast):
    try:
        rs = [json.loads(l) for l in open(f"{work}/pytorch_{autocast}.jsonl") if l.strip()]
    except FileNotFoundError:
        return None
    return dict(summary(rs), version=rs[0]["impl"].split("-", 1)[1]) if rs else None
pt, pt_bf16 = torch_summary("none"), torch_summary("bfloat16")
report = {"benchmark": "training step of the base model, --compute-type bfloat16 vs float32",
          "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu": cpu,
          "threads": runs["float32"][0]["threads"], "target_tokens": runs["float32"][0]["target_tokens"],
          "source_tokens": runs["float32"][0]["source_tokens"], "rounds": len(runs["float32"]),
          "float32": f32, "bfloat16": bf16, "speed_bfloat16_over_float32": f32["median_s"] / bf16["median_s"]}
if pt:
    report["pytorch_float32"] = pt
    report["pytorch_autocast_bfloat16"] = pt_bf16
    report["speed_float32_over_pytorch_float32"] = pt["median_s"] / f32["median_s"]
    report["speed_bfloat16_over_pytorch_autocast_bfloat16"] = pt_bf16["median_s"] / bf16["median_s"]
json.dump(report, open("bench/results/train_compute_types.json", "w"), indent=1)
md = f"""# Training step, bfloat16 against float32 (`bench/run_train_compute_types.sh`)

{report['date']} · {cpu} · {report['threads']} threads · {report['rounds']} rounds alternating · base model,
{report['source_tokens']} source + {report['target_tokens']} target tokens a step

| compute type | s / step | target tok/s | peak RSS MiB | loss after the timed steps |
|---|---:|---:|---:|---:|
| float32 | {f32['median_s']:.3f} | {f32['tokens_per_s']:.0f} | {f32['peak_rss_mib']:.0f} | {f32['loss_last']:.4f} |
| bfloat16 | {bf16['median_s']:.3f} | {bf16['tokens_per_s']:.0f} | {bf16['peak_rss_mib']:.0f} | {bf16['loss_last']:.4f} |

bfloat16 / float32 speed: **{report['speed_bfloat16_over_float32']:.2f}×**

Ceiling: a step is {bf16['gflop']:.0f} GFLOP; bfloat16 runs it at {bf16['gflops']:.0f} GFLOP/s, and the
bfloat16 GEMM peak measured in the same processes (2048³, weights prepared) is
{bf16['gemm_peak_gflops']:.0f} GFLOP/s, so no step can take less than {bf16['step_s_at_gemm_peak']:.3f} s here
({bf16['gflops'] / bf16['gemm_peak_gflops']:.0%} of that peak reached).
"""
if pt:
    md += f"""
PyTorch {pt['version']} from PyPI (`bench/train_peer.py`, same rounds), each against ours at the same precision:

| PyTorch | s / step | target tok/s | peak RSS MiB | ours / PyTorch speed |
|---|---:|---:|---:|---:|
| float32 | {pt['median_s']:.3f} | {pt['tokens_per_s']:.0f} | {pt['peak_rss_mib']:.0f} | **{report['speed_float32_over_pytorch_float32']:.2f}×** (our float32) |
| bfloat16 autocast | {pt_bf16['median_s']:.3f} | {pt_bf16['tokens_per_s']:.0f} | {pt_bf16['peak_rss_mib']:.0f} | **{report['speed_bfloat16_over_pytorch_autocast_bfloat16']:.2f}×** (our bfloat16) |
"""
open("bench/results/train_compute_types.md", "w").write(md)
print(md)
PY
