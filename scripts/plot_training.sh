#!/usr/bin/env bash
# Draws the training curve of a `transformer train` run as a PNG: training loss and dev
# perplexity against optimizer steps (left) and against training time (right), from the run's
# train.log.jsonl. Uses Debian's gnuplot (installed through bootstrap.sh when missing).
#
#   bash scripts/plot_training.sh MODEL_DIR [OUT.png]     (default OUT: MODEL_DIR/training.png)
set -euo pipefail

usage() { echo "usage: $0 MODEL_DIR [OUT.png]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
run_dir=$1
out=${2:-$run_dir/training.png}
log=$run_dir/train.log.jsonl
[ -f "$log" ] || { echo "error: $log: no such file (is $run_dir a training run?)" >&2; exit 1; }

command -v gnuplot >/dev/null && command -v python3 >/dev/null ||
  bash "$(dirname "$0")/bootstrap.sh" gnuplot-nox python3

data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

# JSON lines -> data tables (step, minutes, value) and the plot's settings. A step logged twice
# (a run resumed from a checkpoint older than its last log lines) keeps its latest line.
python3 - "$log" "$data" <<'EOF'
import json, sys
log, out = sys.argv[1], sys.argv[2]
rows = {"train": {}, "valid": {}}
with open(log, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
            if entry.get("event") in rows:
                value = entry["loss"] if entry["event"] == "train" else entry["ppl"]
                rows[entry["event"]][int(entry["step"])] = (float(entry["minutes"]), float(value))
        except (ValueError, KeyError, TypeError):
            sys.exit(f"error: {log}:{number}: not a train.log.jsonl line")
train, valid = rows["train"], rows["valid"]
if not train and not valid:
    sys.exit(f"error: {log}: no train or valid lines yet")
for event, table in rows.items():
    with open(f"{out}/{event}.dat", "w") as f:
        for step in sorted(table):
            f.write(f"{step} {table[step][0]:.4f} {table[step][1]:.6g}\n")
everything = {**train, **valid}
title = [f"{max(everything)} steps in {max(m for m, _ in everything.values()):.1f} min"]
if train:
    title.append(f"last train loss {train[max(train)][1]:.3f}")
if valid:
    best = min(valid.items(), key=lambda kv: kv[1][1])
    title.append(f"best dev perplexity {best[1][1]:.2f} (step {best[0]})")
ppl = [v for _, v in valid.values()] or [1.0]
curves = []
if train:
    curves.append('"{dir}/train.dat" using X:3 with lines ls 1 title "train loss"')
if valid:
    curves.append('"{dir}/valid.dat" using X:3 axes x1y2 with linespoints ls 2 title "dev perplexity"')
with open(f"{out}/settings.gp", "w") as f:
    f.write(f'title = "{" · ".join(title)}"\n')
    f.write(f"has_valid = {int(bool(valid))}\n")
    # a log axis when perplexity spans a decade or more; an explicit range, since gnuplot cannot
    # autoscale a single point on a log axis
    log_axis = max(ppl) / min(ppl) >= 10
    f.write(f"log_ppl = {int(log_axis)}\n")
    low, high = (min(ppl) / 1.5, max(ppl) * 1.5) if log_axis else (min(ppl) * 0.9, max(ppl) * 1.1)
    f.write(f"ppl_low = {low:.6g}; ppl_high = {high:.6g}\n")
    for axis, column in (("step", "1"), ("time", "2")):
        plot = ", ".join(c.format(dir=out).replace("X:", column + ":") for c in curves)
        f.write(f"plot_{axis} = '{plot}'\n")
EOF

run_name=$(basename "$(cd "$run_dir" && pwd)")
gnuplot <<EOF
load "$data/settings.gp"
set terminal pngcairo size 1400,560 noenhanced font "DejaVu Sans,11"
set output "$out.tmp"
set multiplot layout 1,2 title sprintf("Training run '%s': %s", "$run_name", title)
set grid
set key top right
set xrange [0:*]
set ylabel "training loss (label-smoothed, per token)" textcolor rgb "#1f77b4"
set ytics nomirror textcolor rgb "#1f77b4"
if (has_valid) {
  set y2label (log_ppl ? "dev perplexity (log scale)" : "dev perplexity") textcolor rgb "#d62728"
  set y2tics textcolor rgb "#d62728"
  if (log_ppl) { set logscale y2; set y2tics (2,5,10,20,50,100,200,500,1000,2000,5000,10000,20000,50000) }
  set y2range [ppl_low:ppl_high]
}
set style line 1 lc rgb "#1f77b4" lw 2
set style line 2 lc rgb "#d62728" lw 2 pt 7 ps 0.8
set xlabel "optimizer step"
eval "plot ".plot_step
set xlabel "training time (minutes)"
eval "plot ".plot_time
unset multiplot
EOF
mv "$out.tmp" "$out"
echo "wrote $out"
