#!/usr/bin/env bash
# The complexity column of the paper's Table 1, measured: forward time of one self-attention layer
# (d_model 512, 8 heads, one sequence) against its length n = 64 … 4096, full attention vs
# restricted attention (window 32), with a recurrent layer (tanh RNN) as the O(n·d²) reference and
# PyTorch (bench/peers.txt) beside each (nn.MultiheadAttention, with a band mask for the restricted case, and
# nn.RNN) in the same run, alternating rounds. Fits the log–log slope of time against n over
# n >= 512 (expected: about 2 for full attention's core, 1 for restricted and recurrent) and
# writes bench/results/attention_scaling.{md,json,png}.
#
# usage: bench/run_attention_scaling.sh   (from anywhere; installs packages and builds as needed)
# env:   OMP_NUM_THREADS (default 2)  ROUNDS (2)  MAX_N (4096)  WINDOW (32)  MIN_CENTIS (30)
#        BUILD_DIR (build)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-2}
max_n=${MAX_N:-4096}
window=${WINDOW:-32}
min_centis=${MIN_CENTIS:-30}
build=${BUILD_DIR:-build}
results=bench/results

fail() { echo "error: $*" >&2; exit 1; }
source bench/common.sh
bench_prepare attention_scaling_bench gnuplot-nox

work=$(mktemp -d /tmp/attention_scaling.XXXXXX)
trap 'rm -rf "$work"' EXIT
args=(--max-n "$max_n" --window "$window" --min-centis "$min_centis")
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  "$bench_bin" "${args[@]}" >>"$work/ours.jsonl" || fail "attention_scaling_bench failed"
  "$python" bench/attention_scaling_peer.py "${args[@]}" >>"$work/peer.jsonl" ||
    fail "attention_scaling_peer.py failed"
done

mkdir -p "$results"
/usr/bin/python3 - "$work" "$results" "$OMP_NUM_THREADS" "$rounds" "$window" \
    "$(($(date +%s) - start))" <<'PY'
import datetime, json, math, platform, statistics, subprocess, sys
work, results, threads, rounds, window, seconds = sys.argv[1:7]

def load(path):
    cases = {}
    for line in open(path):
        r = json.loads(line)
        cases.setdefault((r["variant"], r["n"]), []).append(r)
    return {k: {"layer_s": statistics.median(x["layer_s"] for x in v),
                "core_s": None if v[0]["core_s"] is None
                else statistics.median(x["core_s"] for x in v)} for k, v in cases.items()}

ours, peer = load(f"{work}/ours.jsonl"), load(f"{work}/peer.jsonl")
lengths = sorted({n for _, n in ours})
variants = ["full", "restricted", "recurrent"]

def slope(table, variant, field):
    """Least-squares slope of log(time) against log(n) over n >= 512."""
    points = [(math.log(n), math.log(table[(variant, n)][field])) for n in lengths
              if n >= 512 and (variant, n) in table and table[(variant, n)][field]]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)

slopes = {side: {f"{v}_{f}": slope(table, v, f) for v in variants for f in ("layer_s", "core_s")}
          for side, table in (("ours", ours), ("pytorch", peer))}
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
except OSError:
    commit = "?"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
report = {"date": when, "commit": commit, "cpu": cpu, "threads": int(threads),
          "rounds": int(rounds), "window": int(window),
          "ours": {f"{v}/{n}": t for (v, n), t in sorted(ours.items())},
          "pytorch": {f"{v}/{n}": t for (v, n), t in sorted(peer.items())},
          "slopes_n_ge_512": slopes}
json.dump(report, open(f"{results}/attention_scaling.json", "w"), indent=1)

ms = lambda s: "—" if s is None else (f"{s * 1e3:.3f}" if s < 0.01 else f"{s * 1e3:.1f}")
ratio = lambda a, b: "—" if not a or not b else f"{b / a:.1f}×"
fmt = lambda x: "—" if x is None else f"{x:.2f}"
rows = []
for n in lengths:
    o = {v: ours.get((v, n), {}) for v in variants}
    p = {v: peer.get((v, n), {}) for v in variants}
    rows.append(f"| {n} | {ms(o['full'].get('layer_s'))} | {ms(o['full'].get('core_s'))} "
                f"| {ms(o['restricted'].get('layer_s'))} | {ms(o['restricted'].get('core_s'))} "
                f"| {ms(o['recurrent'].get('layer_s'))} "
                f"| {ms(p['full'].get('layer_s'))} ({ratio(o['full'].get('layer_s'), p['full'].get('layer_s'))}) "
                f"| {ms(p['restricted'].get('layer_s'))} ({ratio(o['restricted'].get('layer_s'), p['restricted'].get('layer_s'))}) "
                f"| {ms(p['recurrent'].get('layer_s'))} ({ratio(o['recurrent'].get('layer_s'), p['recurrent'].get('layer_s'))}) |")
so, sp = slopes["ours"], slopes["pytorch"]
md = f"""# Table 1's complexity column, measured (`bench/run_attention_scaling.sh`)

{when} · {cpu} · {threads} threads · commit {commit} · {rounds} rounds, medians

Forward time of one self-attention layer (d_model 512, 8 heads, one sequence of n positions,
inference: no attention weights kept) in milliseconds. *Layer* includes the Q, K, V and output
projections (O(n·d²)); *core* is the attention between projected Q, K, V alone. Restricted: each
position attends to the {window} positions on either side (`self_attention_window` {window}).
Recurrent: h_t = tanh(W_x x_t + W_h h_{{t−1}} + b), d = 512, the O(n·d²) row of Table 1 with n
sequential steps. PyTorch beside each, same thread count: nn.MultiheadAttention (restricted =
the same band as a boolean mask; PyTorch computes all n² scores anyway) and nn.RNN; the ratio is
PyTorch's time / ours.

| n | full layer | full core | restricted layer | restricted core | recurrent layer | PyTorch full (ratio) | PyTorch band-masked | PyTorch RNN |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|
""" + "\n".join(rows) + f"""

Log–log slope of time against n, least squares over n = 512 … {lengths[-1]} (Table 1: self-attention
O(n²·d), restricted O(r·n·d), recurrent O(n·d²)):

| | full | restricted | recurrent |
|---|---:|---:|---:|
| ours, core | {fmt(so['full_core_s'])} | {fmt(so['restricted_core_s'])} | {fmt(so['recurrent_core_s'])} |
| ours, layer | {fmt(so['full_layer_s'])} | {fmt(so['restricted_layer_s'])} | {fmt(so['recurrent_layer_s'])} |
| PyTorch, layer | {fmt(sp['full_layer_s'])} | {fmt(sp['restricted_layer_s'])} | {fmt(sp['recurrent_layer_s'])} |

The layer's slope for full attention stays below 2 up to n = 4096 because its projections
(4·n·d² multiply-adds) are still a large share there (n²·d first exceeds 4·n·d² at n = 2048).
Plot: `attention_scaling.png` (log–log, core times, with slope-1 and slope-2 guides).
The whole script took {seconds} s.
"""
open(f"{results}/attention_scaling.md", "w").write(md)
with open(f"{work}/plot.dat", "w") as f:
    for n in lengths:
        vals = [ours.get((v, n), {}).get("core_s") for v in variants]
        vals += [ours.get((v, n), {}).get("layer_s") for v in variants]
        vals += [peer.get((v, n), {}).get("layer_s") for v in ("full", "restricted")]
        f.write(f"{n} " + " ".join("NaN" if x is None else f"{x * 1e3:.6g}" for x in vals) + "\n")
print(md)
PY

first=$(awk 'NR == 1 {print $1, $2}' "$work/plot.dat")
gnuplot <<EOF || fail "gnuplot failed"
set terminal pngcairo size 900,640 font ",11" noenhanced
set output "$results/attention_scaling.png"
set logscale xy 2
set xlabel "sequence length n"
set ylabel "forward time, ms"
set title "One self-attention layer (d_model 512, 8 heads) vs n — Table 1's complexity, measured"
set key top left
set grid
n0 = ${first% *}; t0 = ${first#* }
plot "$work/plot.dat" u 1:2 w lp lw 2 pt 7 t "full attention, core (ours)", \
     "" u 1:3 w lp lw 2 pt 5 t "restricted w=$window, core (ours)", \
     "" u 1:4 w lp lw 2 pt 9 t "recurrent (tanh RNN), core (ours)", \
     "" u 1:5 w lp dt 2 pt 6 t "full attention, whole layer (ours)", \
     "" u 1:6 w lp dt 2 pt 4 t "restricted, whole layer (ours)", \
     "" u 1:8 w lp dt 3 pt 6 t "PyTorch nn.MultiheadAttention, full", \
     "" u 1:9 w lp dt 3 pt 4 t "PyTorch, band mask", \
     t0 * (x / n0) ** 2 w l lc rgb "gray" dt 4 t "slope 2", \
     t0 * (x / n0) w l lc rgb "black" dt 4 t "slope 1"
EOF
echo "wrote $results/attention_scaling.md, .json and .png"
