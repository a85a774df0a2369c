#!/usr/bin/python3
"""Turns the measurements of bench/run_attention_claims.sh into bench/results/attention_claims.md,
attention_claims.json and the attention_claims_{speed,variance,quality,heads}.png plots (gnuplot).

Reads, under --work: speed.jsonl, variance.jsonl, heads.jsonl (attention_claims_bench) and
runs/<kind>_h<heads>_s<seed>/ (config.json, model/train.log.jsonl, bleu.txt, train_seconds.txt).
A missing part is reported as missing, never invented.
"""

import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import statistics
import subprocess


def load_lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def load_runs(work):
    runs = []
    for directory in sorted(glob.glob(os.path.join(work, "runs", "*_h*_s*"))):
        match = re.fullmatch(r"(.+)_h(\d+)_s(\d+)", os.path.basename(directory))
        bleu_path = os.path.join(directory, "bleu.txt")
        if not match or not os.path.exists(bleu_path):
            continue  # unfinished
        kind, heads, seed = match.group(1), int(match.group(2)), int(match.group(3))
        curve, train = [], []
        for line in open(os.path.join(directory, "model", "train.log.jsonl")):
            event = json.loads(line)
            if event.get("event") == "valid":
                curve.append((event["step"], event["ppl"]))
            elif event.get("event") == "train":
                train.append(event)
        bleu = float(re.search(r"BLEU = ([0-9.]+)", open(bleu_path).read()).group(1))
        seconds = float(open(os.path.join(directory, "train_seconds.txt")).read())
        steps = curve[-1][0] if curve else 0
        runs.append(dict(kind=kind, heads=heads, d_k=256 // heads, seed=seed, bleu=bleu,
                         dev_ppl=curve[-1][1] if curve else None, curve=curve, steps=steps,
                         train_seconds=seconds,
                         tokens_per_second=train[-1].get("target_tokens_per_s") if train else None))
    return runs


def spread(values):
    """mean, and half the range (the ± of two seeds)."""
    return statistics.mean(values), (max(values) - min(values)) / 2


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def speed_section(speed, results, md):
    if not speed:
        md.append("_Not measured (stage `speed` not run)._\n")
        return {}
    table = {(r["kind"], r["n"], r["d_k"]): r for r in speed}
    d_ks = sorted({r["d_k"] for r in speed})
    ns = sorted({r["n"] for r in speed})
    md.append("Forward+backward time of the attention function, one head, one sequence, one thread "
              "(ms): scaled dot product / additive, and additive's slowdown.\n")
    md.append("| n | " + " | ".join("d_k %d" % d for d in d_ks) + " |")
    md.append("|---:|" + "---:|" * len(d_ks))
    ratios = []
    for n in ns:
        cells = []
        for d in d_ks:
            s, a = table.get(("scaled_dot", n, d)), table.get(("additive", n, d))
            if not s or not a:
                cells.append("—")
                continue
            ratio = a["forward_backward_s"] / s["forward_backward_s"]
            ratios.append(ratio)
            cells.append("%.3g / %.3g (%.0f×)" % (s["forward_backward_s"] * 1e3,
                                                   a["forward_backward_s"] * 1e3, ratio))
        md.append("| %d | %s |" % (n, " | ".join(cells)))
    forward_ratios = [table[("additive", n, d)]["forward_s"] / table[("scaled_dot", n, d)]["forward_s"]
                      for n in ns for d in d_ks
                      if ("additive", n, d) in table and ("scaled_dot", n, d) in table]
    md.append("")
    md.append("Forward alone (inference path): additive is %.0f× to %.0f× slower (median %.0f×); "
              "forward+backward %.0f× to %.0f× (median %.0f×).\n" % (
                  min(forward_ratios), max(forward_ratios), statistics.median(forward_ratios),
                  min(ratios), max(ratios), statistics.median(ratios)))
    md.append("Peak heap above the Q, K, V inputs (KiB), forward+backward, scaled / additive; and the "
              "[n, n, d_k] tensor tanh(q_i + k_j) that an implementation building it at once (as "
              "autograd would, to keep it for backward) needs for additive attention:\n")
    md.append("| n | d_k | scaled | additive | additive's [n, n, d_k], materialised |")
    md.append("|---:|---:|---:|---:|---:|")
    for n in ns:
        for d in (d_ks[0], d_ks[-1]):
            s, a = table.get(("scaled_dot", n, d)), table.get(("additive", n, d))
            if s and a:
                md.append("| %d | %d | %.0f | %.0f | %.0f |" % (
                    n, d, s["forward_backward_peak_bytes"] / 1024, a["forward_backward_peak_bytes"] / 1024,
                    a["materialised_bytes"] / 1024))
    md.append("")
    dat = os.path.join(results, "attention_claims_speed.dat")
    with open(dat, "w") as f:
        for n in ns:
            row = [str(n)]
            for d in d_ks:
                for kind in ("scaled_dot", "additive"):
                    r = table.get((kind, n, d))
                    row.append("%.6g" % (r["forward_backward_s"] * 1e3) if r else "NaN")
            f.write(" ".join(row) + "\n")
    columns = []
    for index, d in enumerate(d_ks):
        columns.append('"%s" u 1:%d w lp lw 2 pt 7 lc %d t "scaled dot, d_k %d"' % (
            dat, 2 + 2 * index, index + 1, d))
        columns.append('"%s" u 1:%d w lp lw 2 dt 2 pt 6 lc %d t "additive, d_k %d"' % (
            dat, 3 + 2 * index, index + 1, d))
    gnuplot("""set terminal pngcairo size 900,640 font ",11" noenhanced
set output "%s"
set logscale xy 2
set xlabel "sequence length n"
set ylabel "forward + backward time, ms (one head, one thread)"
set title "Scaled dot-product vs additive attention (§3.2.1)"
set key top left
set grid
plot %s
""" % (os.path.join(results, "attention_claims_speed.png"), ", ".join(columns)))
    os.remove(dat)
    return {"median_forward_ratio": statistics.median(forward_ratios),
            "median_forward_backward_ratio": statistics.median(ratios), "cases": speed}


def variance_section(variance, results, md):
    if not variance:
        md.append("_Not measured (stage `variance` not run)._\n")
        return {}
    by = {(r["kind"], r["d_k"]): r for r in variance}
    d_ks = sorted({r["d_k"] for r in variance})
    keys = variance[0]["keys"]
    md.append("Random q, k, v with unit-variance components, %d keys per query (maximum entropy "
              "ln %d = %.2f nats). Entropy and the largest weight are row means; the gradient norms "
              "are per query for a unit-variance upstream gradient: the share of the gradient "
              "at the weights that the softmax passes to the logits (‖∂L/∂logits‖ / ‖∂L/∂weights‖), "
              "and the norm that reaches the query vector.\n" % (keys, keys, math.log(keys)))
    md.append("| d_k | var(q·k) | entropy scaled / unscaled / additive | largest weight "
              "scaled / unscaled / additive | softmax's gradient share scaled / unscaled / additive | "
              "‖∂L/∂q‖ scaled / unscaled / additive |")
    md.append("|---:|---:|---|---|---|---|")
    for d in d_ks:
        s, u, a = by[("scaled_dot", d)], by[("dot", d)], by[("additive", d)]
        md.append("| %d | %.1f | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.3f / %.3f / %.3f | "
                  "%.3f / %.3f / %.3f |" % (
                      d, s["dot_variance"], s["entropy"], u["entropy"], a["entropy"],
                      s["top_weight"], u["top_weight"], a["top_weight"], s["softmax_gradient_ratio"],
                      u["softmax_gradient_ratio"], a["softmax_gradient_ratio"], s["query_gradient_norm"],
                      u["query_gradient_norm"], a["query_gradient_norm"]))
    md.append("")
    dat = os.path.join(results, "attention_claims_variance.dat")
    with open(dat, "w") as f:
        for d in d_ks:
            f.write("%d %s\n" % (d, " ".join("%.6g %.6g" % (by[(k, d)]["entropy"],
                                                              by[(k, d)]["softmax_gradient_ratio"])
                                             for k in ("scaled_dot", "dot", "additive"))))
    gnuplot("""set terminal pngcairo size 900,640 font ",11" noenhanced
set output "%s"
set logscale x 2
set xlabel "d_k"
set ylabel "softmax entropy, nats"
set y2label "share of the gradient the softmax passes on"
set y2tics
set ytics nomirror
set title "Why 1/sqrt(d_k): unscaled dot products saturate the softmax as d_k grows"
set key center right
set grid
plot "%s" u 1:2 w lp lw 2 pt 7 lc 1 t "entropy, scaled", "" u 1:4 w lp lw 2 pt 5 lc 2 t "entropy, unscaled", \\
     "" u 1:6 w lp lw 2 pt 9 lc 3 t "entropy, additive", \\
     "" u 1:3 axes x1y2 w lp dt 2 pt 6 lc 1 t "gradient, scaled", "" u 1:5 axes x1y2 w lp dt 2 pt 4 lc 2 t "gradient, unscaled", \\
     "" u 1:7 axes x1y2 w lp dt 2 pt 8 lc 3 t "gradient, additive"
""" % (os.path.join(results, "attention_claims_variance.png"), dat))
    os.remove(dat)
    return {"cases": variance}


def heads_section(heads, steps, runs, results, md):
    if heads:
        md.append("One multi-head self-attention layer, d_model 256, projections included, 2 threads "
                  "(ms), and its forward FLOPs: the projections and the two attention products "
                  "do not depend on h; only the softmax's h·n² weights do.\n")
        md.append("| h | d_k | batch × n | forward ms | fwd+bwd ms | projection GFLOP | "
                  "Q·Kᵀ + P·V GFLOP | softmax GFLOP | weights MiB |")
        md.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in heads:
            md.append("| %d | %d | %d × %d | %.2f | %.2f | %.3f | %.3f | %.4f | %.1f |" % (
                r["heads"], r["d_k"], r["batch"], r["n"], r["forward_s"] * 1e3,
                r["forward_backward_s"] * 1e3, r["projection_flops"] / 1e9,
                r["attention_product_flops"] / 1e9, r["softmax_flops"] / 1e9,
                r["weights_bytes"] / 2 ** 20))
        md.append("")
    else:
        md.append("_Layer timings not measured (stage `heads` not run)._\n")
    if steps:
        md.append("Whole training steps of the small model (d_model 256, d_ff 1024, 3+3 layers; "
                  "zero grads + forward + backward + Adam) on %d pairs of 31 + 31 tokens, 2 threads "
                  "(train_bench --config; median of 5 steps). The model FLOPs of a step do not "
                  "depend on h.\n" % steps[0]["batch"])
        md.append("| h | d_k | ms per step | GFLOP per step | GFLOP/s |")
        md.append("|---:|---:|---:|---:|---:|")
        for r in steps:
            h = r["config"]["heads"]
            md.append("| %d | %d | %.1f | %.2f | %.0f |" % (
                h, r["config"]["d_model"] // h, r["median_s"] * 1e3, r["gflop"], r["gflops"]))
        md.append("")
    scaled = [r for r in runs if r["kind"] == "scaled_dot"]
    if scaled:
        md.append("Quality of the small model (scaled dot product) at equal steps, by heads (the "
                  "runs of section 3; mean ± half the range over seeds):\n")
        md.append("| h | d_k | seeds | dev perplexity | Acts BLEU (greedy) |")
        md.append("|---:|---:|---:|---:|---:|")
        for h in sorted({r["heads"] for r in scaled}):
            group = [r for r in scaled if r["heads"] == h]
            ppl = spread([r["dev_ppl"] for r in group])
            bleu = spread([r["bleu"] for r in group])
            md.append("| %d | %d | %d | %.1f ± %.1f | %.2f ± %.2f |" % (
                h, 256 // h, len(group), *ppl, *bleu))
        md.append("")
    if heads:
        dat = os.path.join(results, "attention_claims_heads.dat")
        with open(dat, "w") as f:
            for r in heads:
                if r["n"] == heads[0]["n"]:
                    f.write("%d %.6g %.6g\n" % (r["heads"], r["forward_s"] * 1e3,
                                                r["forward_backward_s"] * 1e3))
        gnuplot("""set terminal pngcairo size 900,640 font ",11" noenhanced
set output "%s"
set logscale x 2
set xlabel "heads h (d_k = 256 / h)"
set ylabel "ms per layer call (d_model 256, batch %d x n %d)"
set yrange [0:*]
set title "Multi-head attention: the cost of heads at fixed d_model (§3.2.2)"
set key top left
set grid
plot "%s" u 1:2 w lp lw 2 pt 7 t "forward", "" u 1:3 w lp lw 2 pt 5 t "forward + backward"
""" % (os.path.join(results, "attention_claims_heads.png"), heads[0]["batch"], heads[0]["n"], dat))
        os.remove(dat)
    return {"layer": heads, "training_steps": steps}


def quality_section(runs, results, md, args):
    if not runs:
        md.append("_No finished training runs (stage `quality` not run)._\n")
        return {}
    md.append("Small model (d_model 256, d_ff 1024, 3+3 layers), quickstart corpus, %s steps of %s "
              "tokens, warm-up %s to a 2e-3 peak, dropout 0.1; heads vary at fixed d_model. Dev "
              "perplexity at the last step and greedy BLEU on Acts, mean ± half the range over "
              "seeds (seeds: %s).\n" % (args.steps, args.batch_tokens, args.warmup, args.seeds))
    kinds = ["scaled_dot", "dot", "additive"]
    d_ks = sorted({r["d_k"] for r in runs if r["kind"] != "scaled_dot" or r["heads"] in (2, 4, 8)})
    md.append("| d_k (h) | " + " | ".join("%s: dev ppl / BLEU" % k for k in kinds) + " |")
    md.append("|---|" + "---|" * len(kinds))
    summary = []
    for d in d_ks:
        cells = []
        for kind in kinds:
            group = [r for r in runs if r["kind"] == kind and r["d_k"] == d]
            if not group:
                cells.append("—")
                continue
            ppl, bleu = spread([r["dev_ppl"] for r in group]), spread([r["bleu"] for r in group])
            cells.append("%.1f ± %.1f / %.2f ± %.2f (%d)" % (*ppl, *bleu, len(group)))
            summary.append(dict(kind=kind, d_k=d, seeds=len(group), dev_ppl=ppl[0],
                                dev_ppl_spread=ppl[1], bleu=bleu[0], bleu_spread=bleu[1]))
        md.append("| %d (%d) | %s |" % (d, 256 // d, " | ".join(cells)))
    md.append("")
    # Dev perplexity curves, mean over seeds, one line per kind and d_k.
    dat = os.path.join(results, "attention_claims_quality.dat")
    plots = []
    with open(dat, "w") as f:
        index = 0
        for kind in kinds:
            for d in d_ks:
                group = [r for r in runs if r["kind"] == kind and r["d_k"] == d]
                if not group:
                    continue
                steps = [s for s, _ in group[0]["curve"]]
                f.write("# %s d_k %d\n" % (kind, d))
                for i, step in enumerate(steps):
                    f.write("%d %.6g\n" % (step, statistics.mean(r["curve"][i][1] for r in group
                                                                  if i < len(r["curve"]))))
                f.write("\n\n")
                style = {"scaled_dot": "lw 2", "dot": "lw 2 dt 2", "additive": "lw 2 dt 3"}[kind]
                plots.append('"%s" index %d w lp %s pt %d lc %d t "%s, d_k %d"' % (
                    dat, index, style, 7, d_ks.index(d) + 1, kind, d))
                index += 1
    gnuplot("""set terminal pngcairo size 900,640 font ",11" noenhanced
set output "%s"
set logscale y
set xlabel "training step"
set ylabel "dev perplexity (mean over seeds)"
set title "Scaled dot vs unscaled dot vs additive attention, small model, equal steps"
set key top right
set grid
plot %s
""" % (os.path.join(results, "attention_claims_quality.png"), ", ".join(plots)))
    os.remove(dat)
    return {"summary": summary, "runs": runs}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--batch-tokens", required=True)
    parser.add_argument("--warmup", required=True)
    parser.add_argument("--seeds", required=True)
    args = parser.parse_args()
    speed = load_lines(os.path.join(args.work, "speed.jsonl"))
    variance = load_lines(os.path.join(args.work, "variance.jsonl"))
    heads = load_lines(os.path.join(args.work, "heads.jsonl"))
    heads_steps = load_lines(os.path.join(args.work, "heads_steps.jsonl"))
    runs = load_runs(args.work)
    cpu = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    md = ["# The paper's claims about attention, measured",
          "",
          "Written by `bench/run_attention_claims.sh` on %s (%s, %d cores, %s)." % (
              datetime.date.today().isoformat(), cpu, os.cpu_count(), platform.machine()),
          "",
          "## 1. Speed and memory: scaled dot product vs additive attention (§3.2.1)",
          ""]
    report = {"date": datetime.date.today().isoformat(), "cpu": cpu}
    report["speed"] = speed_section(speed, args.results, md)
    md += ["## 2. The variance argument for 1/sqrt(d_k) (§3.2.1, footnote 4)", ""]
    report["variance"] = variance_section(variance, args.results, md)
    md += ["## 3. Quality: scaled vs unscaled vs additive at d_k 32, 64, 128", ""]
    report["quality"] = quality_section(runs, args.results, md, args)
    md += ["## 4. Heads at fixed d_model (§3.2.2, Table 3 row A)", ""]
    report["heads"] = heads_section(heads, heads_steps, runs, args.results, md)
    with open(os.path.join(args.results, "attention_claims.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.results, "attention_claims.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("wrote %s/attention_claims.md, .json and attention_claims_*.png" % args.results)


if __name__ == "__main__":
    main()
