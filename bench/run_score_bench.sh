#!/usr/bin/env bash
# Scoring benchmark, ours vs PyTorch in one run (docs/performance.md, "How we measure"): builds score_bench, writes the
# base model + a 32×32→32 batch once, then runs bench/score_bench and bench/score_peer.py
# alternately for a few rounds on the same files and thread count, checks that both give the
# same per-sentence log-probabilities, and writes bench/results/score.{md,json}.
#
# usage: bench/run_score_bench.sh        (from anywhere; installs packages and builds as needed)
# env:   OMP_NUM_THREADS (default 2)  ROUNDS (3)  REPEATS (10)  BUILD_DIR (build)
#        WORK_DIR (a fresh temp dir, removed at the end unless given)
#        PEERS_VENV (where bench/peers.sh installs the peers)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-3}
repeats=${REPEATS:-10}
build=${BUILD_DIR:-build}
results=bench/results

fail() { echo "error: $*" >&2; exit 1; }

source bench/common.sh
bench_prepare score_bench

if [[ -n "${WORK_DIR:-}" ]]; then
  work=$WORK_DIR
  mkdir -p "$work"
else
  work=$(mktemp -d /tmp/score_bench.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi

start=$(date +%s)
"$bench_bin" --work-dir "$work" --prepare-only 2>/dev/null || fail "score_bench --prepare-only failed"
: >"$work/ours.jsonl"
: >"$work/peer.jsonl"
for round in $(seq 1 "$rounds"); do
  "$bench_bin" --work-dir "$work" --reuse --repeats "$repeats" >>"$work/ours.jsonl" ||
    fail "score_bench failed in round $round"
  "$python" bench/score_peer.py --work-dir "$work" --repeats "$repeats" >>"$work/peer.jsonl" ||
    fail "score_peer.py failed in round $round"
  echo "round $round/$rounds done ($(( $(date +%s) - start )) s)" >&2
done

mkdir -p "$results"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src 2>/dev/null; then commit="$commit+dirty"; fi

"$python" - "$work/ours.jsonl" "$work/peer.jsonl" "$results" "$cpu" "$commit" <<'EOF'
import datetime, json, statistics, sys

ours_path, peer_path, results, cpu, commit = sys.argv[1:6]
ours = [json.loads(line) for line in open(ours_path) if line.strip()]
peer = [json.loads(line) for line in open(peer_path) if line.strip()]
tolerance = 1e-3  # per-sentence total, natural log

def summary(runs):
    med = lambda key: statistics.median(r[key] for r in runs)
    phases = None
    if runs[0].get("phases"):
        phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
    return {
        "impl": runs[0]["impl"], "runs": len(runs), "threads": runs[0]["threads"],
        "median_s": med("median_s"), "tokens_per_s": med("tokens_per_s"),
        "tokens_per_s_each_run": [r["tokens_per_s"] for r in runs],
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "load_s": med("load_s"), "gflops": med("gflops"), "gemm_peak_gflops": med("gemm_peak_gflops"),
        "mfu": med("mfu"), "phases": phases, "totals": runs[0]["totals"],
        **({"blas": runs[0]["blas"]} if "blas" in runs[0] else {}),
    }

o, p = summary(ours), summary(peer)
diffs = [abs(a - b) for a, b in zip(o["totals"], p["totals"])]
# Every run of each side must also agree with that side's first run.
spread = max(abs(a - b) for runs in (ours, peer) for r in runs for a, b in zip(r["totals"], runs[0]["totals"]))
agree = len(diffs) > 0 and max(diffs) <= tolerance and spread <= tolerance
ratio = o["tokens_per_s"] / p["tokens_per_s"]
round_ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, peer)]
shape = ours[0]
report = {
    "benchmark": "score_forward (teacher-forced scoring), base model, shared vocab %d" % 8000,
    "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    "cpu": cpu, "commit": commit, "threads": o["threads"],
    "batch": shape["batch"], "src_len_with_eos": shape["src_len"], "tgt_len_with_bos": shape["tgt_len"],
    "target_tokens": shape["target_tokens"], "gflop_per_batch": shape["gflop"],
    "warmup": shape["warmup"], "repeats": shape["repeats"],
    "ours": o, "pytorch": p,
    "ratio_tokens_per_s": ratio, "ratio_each_round": round_ratios,
    "totals_max_abs_diff": max(diffs) if diffs else None, "totals_tolerance": tolerance,
    "totals_agree": agree,
}
with open(f"{results}/score.json", "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

def phase(s, key):
    return "%.3f" % s["phases"][key] if s["phases"] else "-"

md = f"""# Scoring benchmark (`bench/run_score_bench.sh`)

{report['date']} · {cpu} · {o['threads']} threads · commit {commit}

Teacher-forced scoring (`score_forward`) of the base model (d_model 512, 6+6 layers, shared
8000-token vocabulary), one batch of {shape['batch']} pairs × 32 source / 32 target tokens
({shape['target_tokens']} target tokens incl. eos, {shape['gflop']:.1f} GFLOP of matrix products).
Median of {len(ours)} runs each, alternated; each run: {shape['warmup']} warm-up + {shape['repeats']} timed repetitions.
MFU is against the best sgemm rate each side measured on the model's GEMM shapes in the same run.

| | target tokens/s | median s/batch | peak RSS MiB | GFLOP/s | GEMM peak GFLOP/s | MFU | encoder s | decoder s | projection s |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| transformer-cpp | {o['tokens_per_s']:.0f} | {o['median_s']:.3f} | {o['peak_rss_mib']:.0f} | {o['gflops']:.0f} | {o['gemm_peak_gflops']:.0f} | {o['mfu']:.2f} | {phase(o, 'encoder_s')} | {phase(o, 'decoder_s')} | {phase(o, 'projection_s')} |
| PyTorch {p['impl'].split('-', 1)[1]} ({p.get('blas', '?')}) | {p['tokens_per_s']:.0f} | {p['median_s']:.3f} | {p['peak_rss_mib']:.0f} | {p['gflops']:.0f} | {p['gemm_peak_gflops']:.0f} | {p['mfu']:.2f} | {phase(p, 'encoder_s')} | {phase(p, 'decoder_s')} | {phase(p, 'projection_s')} |

**Ratio ours / PyTorch (tokens/s): {ratio:.2f}×** (per round: {', '.join('%.2f' % r for r in round_ratios)}).
Per-sentence totals (first {len(diffs)}): max |difference| {max(diffs):.2e} (tolerance {tolerance}): {'agree' if agree else 'DISAGREE'}.
Peak RSS includes loading the 193 MB model file.
"""
with open(f"{results}/score.md", "w") as f:
    f.write(md)

print(f"ours:    {o['tokens_per_s']:8.1f} tokens/s  median {o['median_s']:.3f} s  peak RSS {o['peak_rss_mib']:.0f} MiB  MFU {o['mfu']:.2f}")
print(f"pytorch: {p['tokens_per_s']:8.1f} tokens/s  median {p['median_s']:.3f} s  peak RSS {p['peak_rss_mib']:.0f} MiB  MFU {p['mfu']:.2f} ({p.get('blas', '?')})")
print(f"ratio ours/pytorch: {ratio:.2f}x  (rounds: {', '.join('%.2f' % r for r in round_ratios)})")
print(f"totals ours    {o['totals']}")
print(f"totals pytorch {p['totals']}")
print(f"max |diff| {max(diffs):.2e}: {'agree' if agree else 'DISAGREE'}")
print(f"wrote {results}/score.md and {results}/score.json")
if not agree:
    print("error: per-sentence totals differ beyond %g: the two sides do not compute the same thing" % tolerance,
          file=sys.stderr)
    sys.exit(1)
EOF
