#!/usr/bin/env bash
# Training benchmark, ours vs PyTorch in one run (docs/performance.md, "How we measure"): builds train_bench, then runs
# bench/train_bench and bench/train_peer.py alternately for a few rounds — one training step
# (zero grads, forward, label-smoothed loss, backward, Adam) of the base model with a shared
# 8000-token vocabulary on a 64-pair batch of 32 source / 32 target positions, same thread count —
# and writes bench/results/train.{md,json} with the medians, the tokens/s ratio, each side's MFU
# against the GEMM peak it measured itself, peak RSS and the forward / backward / optimizer split.
#
# COMPUTE_TYPE=bfloat16 runs ours in bfloat16 (train --compute-type bfloat16) against PyTorch's
# bfloat16 autocast (train_peer.py --autocast bfloat16) and writes bench/results/train_bfloat16.*.
#
# LENGTHS=MIN:MAX times batches of varied lengths instead of the fixed one, as training on a corpus
# runs them: train_bench --batch-tokens BATCH_TOKENS (default 8000) --lengths MIN:MAX --batches
# BATCHES (default 4) groups random pairs by length as `transformer train` does and writes its
# batches, which train_peer.py --batches-file then runs padded and masked; a step is a pass over
# them. Results go to bench/results/train_varied{,_bfloat16}.*.
#
# usage: bench/run_train_bench.sh        (from anywhere; installs packages and builds as needed)
# env:   LENGTHS BATCH_TOKENS BATCHES  COMPUTE_TYPE (float32)  OMP_NUM_THREADS (default 2)  ROUNDS (3)  STEPS (5)  WARMUP (2)  PHASE_REPEATS (3)
#        QUIET_WAIT (60: seconds to wait for other processes to go idle before each run)
#        BUILD_DIR (build)  PEERS_VENV (bench/peers.sh)
# Takes about 5 minutes on 2 cores when the machine is otherwise idle (PyTorch needs ~5 s a
# step, ours ~2 s).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
warmup=${WARMUP:-2}
phase_repeats=${PHASE_REPEATS:-3}
quiet_wait=${QUIET_WAIT:-60}
build=${BUILD_DIR:-build}
results=bench/results
compute_type=${COMPUTE_TYPE:-float32}
case $compute_type in
  float32) peer_precision=(); name=train ;;
  bfloat16) peer_precision=(--autocast bfloat16); name=train_bfloat16 ;;
  *) echo "error: COMPUTE_TYPE is float32 or bfloat16, not $compute_type" >&2; exit 1 ;;
esac

fail() { echo "error: $*" >&2; exit 1; }

source bench/common.sh
bench_prepare train_bench

work=$(mktemp -d /tmp/train_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
common=(--steps "$steps" --warmup "$warmup")
ours_shape=(--profile --phase-repeats "$phase_repeats")
peer_shape=()
if [ -n "${LENGTHS:-}" ]; then
  name=${name/train/train_varied}
  ours_shape=(--batch-tokens "${BATCH_TOKENS:-8000}" --lengths "$LENGTHS" --batches "${BATCHES:-4}"
              --write-batches "$work/batches.jsonl")
  peer_shape=(--batches-file "$work/batches.jsonl")
fi

# This machine is shared: around each run, record the whole machine's busy CPU time (/proc/stat,
# in clock ticks) and the wall time, so that the summary can subtract the run's own CPU time
# (cpu_s in its JSON line) and report how many cores other processes took meanwhile.
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
measured() {  # measured JSONL LOADFILE command...: appends "busy_ticks start end" to LOADFILE
  local jsonl=$1 loadfile=$2 b0 t0
  shift 2
  b0=$(busy_ticks)
  t0=$(date +%s.%N)
  "$@" >>"$jsonl" || return 1
  echo "$(( $(busy_ticks) - b0 )) $t0 $(date +%s.%N)" >>"$loadfile"
}

# Before each run, wait (up to QUIET_WAIT seconds) for a second in which other processes use
# less than 0.2 of a core: two OpenMP threads on two cores slow down several-fold when a third
# process takes one of them (measured: PyTorch 5 s → 17 s a step next to a compiler).
wait_quiet() {
  local deadline=$((SECONDS + quiet_wait)) b0
  while ((SECONDS < deadline)); do
    b0=$(busy_ticks)
    sleep 1
    (( ($(busy_ticks) - b0) * 5 < ticks_per_s )) && return 0
  done
  echo "warning: other processes still busy after ${quiet_wait} s; running anyway" >&2
}
ticks_per_s=$(getconf CLK_TCK)

start=$(date +%s)
: >"$work/ours.jsonl"
: >"$work/peer.jsonl"
for round in $(seq 1 "$rounds"); do
  wait_quiet
  measured "$work/ours.jsonl" "$work/ours.load" "$bench_bin" "${common[@]}" \
    --compute-type "$compute_type" "${ours_shape[@]}" ||
    fail "train_bench failed in round $round"
  wait_quiet
  measured "$work/peer.jsonl" "$work/peer.load" "$python" bench/train_peer.py "${common[@]}" "${peer_precision[@]}" "${peer_shape[@]}" ||
    fail "train_peer.py failed in round $round"
  echo "round $round/$rounds done ($(( $(date +%s) - start )) s)" >&2
done

mkdir -p "$results"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src 2>/dev/null; then commit="$commit+dirty"; fi
load=$(cut -d' ' -f1-3 /proc/loadavg)

"$python" - "$work" "$results" "$cpu" "$commit" "$load" "$ticks_per_s" "$name" "$compute_type" <<'EOF'
import datetime, json, statistics, sys

work, results, cpu, commit, load, ticks_per_s, name, compute_type = sys.argv[1:9]

def read_runs(side):
    runs = [json.loads(line) for line in open(f"{work}/{side}.jsonl") if line.strip()]
    for run, line in zip(runs, open(f"{work}/{side}.load")):
        ticks, t0, t1 = line.split()
        wall = float(t1) - float(t0)
        # Cores' worth of CPU other processes used during this run (noise on a shared machine).
        run["other_cores"] = max(0.0, (int(ticks) / float(ticks_per_s) - run["cpu_s"]) / wall)
    return runs

ours_all, peer_all = read_runs("ours"), read_runs("peer")
# A round counts as clean when other processes took under 0.2 of a core during both of its runs.
# The medians use the clean rounds when there is at least one (every round stays listed in the
# JSON); otherwise all rounds, and the report says the numbers are noisy.
noise_limit = 0.2
clean = [i for i, (a, b) in enumerate(zip(ours_all, peer_all))
         if a["other_cores"] <= noise_limit and b["other_cores"] <= noise_limit]
used = clean if clean else list(range(len(ours_all)))
ours, peer = [ours_all[i] for i in used], [peer_all[i] for i in used]

def summary(runs):
    med = lambda key: statistics.median(r[key] for r in runs)
    phases = None
    if runs[0].get("phases"):
        phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
    out = {
        "impl": runs[0]["impl"], "runs": len(runs), "threads": runs[0]["threads"],
        "parameters": runs[0]["parameters"],
        "median_s": med("median_s"), "tokens_per_s": med("tokens_per_s"),
        "tokens_per_s_each_run": [r["tokens_per_s"] for r in runs],
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "setup_s": med("setup_s"), "gflops": med("gflops"), "gemm_peak_gflops": med("gemm_peak_gflops"),
        "mfu": med("mfu"), "phases": phases,
        "loss_first": runs[0]["loss_first"], "loss_last": runs[0]["loss_last"],
    }
    for key in ("blas", "dropout_sites"):
        if key in runs[0]:
            out[key] = runs[0][key]
    return out

o, p = summary(ours), summary(peer)
for side, runs in ((o, ours_all), (p, peer_all)):
    side["all_rounds"] = [{"tokens_per_s": r["tokens_per_s"], "median_s": r["median_s"], "mfu": r["mfu"],
                        "gemm_peak_gflops": r["gemm_peak_gflops"], "other_cores": round(r["other_cores"], 2)}
                       for r in runs]
ratio = o["tokens_per_s"] / p["tokens_per_s"]
round_ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours_all, peer_all)]
shape = ours[0]
report = {
    "benchmark": "training step (zero grads + forward + label-smoothed loss + backward + Adam), "
                 "base model, shared vocab 8000",
    "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    "cpu": cpu, "commit": commit, "threads": o["threads"], "load_average_after": load,
    "compute_type": compute_type,
    "batch": shape["batch"], "src_len_with_eos": shape["src_len"], "tgt_len_with_bos": shape["tgt_len"],
    "source_tokens": shape["source_tokens"], "target_tokens": shape["target_tokens"],
    "gflop_per_step": shape["gflop"],
    **({key: shape[key] for key in ("batch_tokens", "lengths", "batches", "batch_shapes")}
       if "batch_shapes" in shape else {}),
    "flop_formula": "3 x forward matmul FLOPs (2 per MAC): per layer q/k/v/o, cross-attention "
                    "q/o on target rows and k/v on source rows, QK^T and PV (full, causal not "
                    "subtracted), fc1/fc2, plus the tied vocabulary projection; element-wise work "
                    "and Adam not counted",
    "warmup": shape["warmup"], "steps": shape["steps"],
    "ours": o, "pytorch": p,
    "ratio_tokens_per_s": ratio, "ratio_each_round": round_ratios,
    "rounds": len(ours_all), "rounds_used": [i + 1 for i in used], "noise_limit_cores": noise_limit,
}
noisy = not clean
report["noisy"] = noisy
others = lambda runs: ", ".join("%.2f" % r["other_cores"] for r in runs)
noise = (f"\n\n**Noisy: every round had other processes taking over {noise_limit} of a core; rerun on a quiet "
         f"machine.**" if noisy else
         f" Medians over the clean rounds ({', '.join(str(i + 1) for i in used)} of {len(ours_all)}: "
         f"other processes under {noise_limit} of a core during both runs).")

with open(f"{results}/{name}.json", "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

def phase(s, key):
    return "%.3f" % s["phases"][key] if s["phases"] and key in s["phases"] else "-"

op, pp = o["phases"], p["phases"]
split = f"""
Where the time goes (medians of the per-call times inside the timed steps; ours' forward from
`--profile`, the loss-only path with grad_scale 0, which keeps 2 layer caches instead of all 12
but otherwise does the same work, and backward = forward+backward − forward):

| | zero grads s | forward s | backward s | Adam s |
|---|---:|---:|---:|---:|
| transformer-cpp | {op['zero_grad_s']:.3f} | {phase(o, 'forward_s')} | {phase(o, 'backward_s')} | {op['optimizer_s']:.3f} |
| PyTorch | {pp['zero_grad_s']:.3f} | {pp['forward_s']:.3f} | {pp['backward_s']:.3f} | {pp['optimizer_s']:.3f} |
"""
if "encoder_forward_s" in op:
    split += f"""
Our forward, split: encoder stack {op['encoder_forward_s']:.3f} s, decoder stack
{op['decoder_forward_s']:.3f} s, vocabulary projection + loss {op['projection_loss_forward_s']:.3f} s.
"""

if "batch_shapes" in shape:  # LENGTHS: a step is a pass over batches of varied lengths
    batches = (f"Batches of varied lengths, as training on a corpus runs them: random pairs with "
               f"target lengths uniform in [{shape['lengths'][0]}, {shape['lengths'][1]}] (sources 0.8 to "
               f"1.25 times as long) grouped by length into batches of up to {shape['batch_tokens']} "
               f"padded tokens (`train --batch-tokens`); a step here is a pass over the "
               f"{shape['batches']} batches (pairs × source × target positions: "
               + ", ".join("%d × %d × %d" % tuple(b) for b in shape["batch_shapes"])
               + f"), an optimizer step each, {shape['source_tokens']} source and "
               f"{shape['target_tokens']} target tokens without padding. PyTorch runs the same "
               f"batches, padded and masked (key padding masks, ignore_index in the loss)")
else:
    batches = (f"One fixed batch: {shape['batch']} pairs × {shape['src_len']} source positions (with eos) "
               f"and {shape['tgt_len']} target positions (with bos) = "
               f"{shape['source_tokens'] + shape['target_tokens']} tokens, {shape['target_tokens']} "
               f"target tokens incl. eos")
precision = ("float32 on both sides" if compute_type == "float32" else
             "bfloat16: ours `--compute-type bfloat16` (bfloat16 products, float32 master weights and "
             "Adam), PyTorch's forward and loss under `torch.autocast(dtype=torch.bfloat16)` (its "
             "mixed precision)")
md = f"""# Training benchmark (`bench/run_train_bench.sh`)

{report['date']} · {cpu} · {o['threads']} threads · commit {commit} · PyTorch {p['impl'].split('-', 1)[1]}

Precision: {precision}.

One training step of the base model (d_model 512, 6+6 layers, post-norm, relu, one shared
8000-token embedding tied to the output projection; {o['parameters'] / 1e6:.1f} M parameters):
zero gradients, forward with dropout 0.1 (embedding sums and sublayer outputs), label-smoothed
(0.1) cross-entropy, backward, Adam (0.9, 0.98, 1e-9, the paper's schedule).
{batches}; {shape['gflop']:.0f} GFLOP of matrix products a step, padded positions included
(3 × the forward's: each product has two of the same size in the backward).
{len(ours_all)} rounds, each one run of ours then one of PyTorch; each run: {shape['warmup']} warm-up + {shape['steps']} timed steps.
MFU is against the fp32 GEMM peak each side measured in the same process (square
{shape['gemm_size']}³ product: the faster of oneDNN's sgemm and matmul for ours, torch.mm → {p.get('blas', '?')}
for PyTorch), in both precisions.

| | target tokens/s | median s/step | peak RSS MiB | GFLOP/s | GEMM peak GFLOP/s | MFU |
|---|---:|---:|---:|---:|---:|---:|
| transformer-cpp | {o['tokens_per_s']:.0f} | {o['median_s']:.3f} | {o['peak_rss_mib']:.0f} | {o['gflops']:.0f} | {o['gemm_peak_gflops']:.0f} | {o['mfu']:.2f} |
| PyTorch {p['impl'].split('-', 1)[1]} ({p.get('blas', '?')}) | {p['tokens_per_s']:.0f} | {p['median_s']:.3f} | {p['peak_rss_mib']:.0f} | {p['gflops']:.0f} | {p['gemm_peak_gflops']:.0f} | {p['mfu']:.2f} |

**Ratio ours / PyTorch (target tokens/s): {ratio:.2f}×** (per round: {', '.join('%.2f' % r for r in round_ratios)}).
Other processes' CPU during each run, in cores (machine busy time minus the run's own): ours
{others(ours_all)}; PyTorch {others(peer_all)}.{noise}
{split}
PyTorch is the stock `nn.Transformer` (batch_first) with the attention-weight and feed-forward
dropouts set to 0 so that both sides drop the same activations; it adds a final LayerNorm after
each stack, which ours (post-norm) does not have. Loss per token at the first step
(sanity, different initialisations): ours {o['loss_first']:.3f}, PyTorch {p['loss_first']:.3f}.
Peak RSS is the process's ru_maxrss after the timed steps (PyTorch's includes the interpreter and
libtorch).
"""
with open(f"{results}/{name}.md", "w") as f:
    f.write(md)

def line(name, s):
    ph = s["phases"]
    split = (f"  forward {ph['forward_s']:.2f} s / backward {ph['backward_s']:.2f} s / Adam {ph['optimizer_s']:.2f} s"
             if "forward_s" in ph else "")
    return (f"{name} {s['tokens_per_s']:8.1f} tokens/s  median {s['median_s']:.3f} s/step  "
            f"peak RSS {s['peak_rss_mib']:.0f} MiB  MFU {s['mfu']:.2f} (peak {s['gemm_peak_gflops']:.0f} GFLOP/s){split}")

print(line("ours:   ", o))
print(line("pytorch:", p) + f"  ({p.get('blas', '?')})")
print(f"ratio ours/pytorch: {ratio:.2f}x  (rounds: {', '.join('%.2f' % r for r in round_ratios)})")
print(f"other processes' CPU during runs (cores): ours {others(ours_all)}; pytorch {others(peer_all)}")
if noisy:
    print(f"warning: every round had other processes taking over {noise_limit} of a core; the numbers are noisy",
          file=sys.stderr)
else:
    print(f"medians over clean rounds {[i + 1 for i in used]} of {len(ours_all)}")
print(f"wrote {results}/{name}.md and {results}/{name}.json")
EOF
