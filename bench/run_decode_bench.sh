#!/usr/bin/env bash
# Decoding benchmark, ours vs PyTorch in one run (docs/performance.md, "How we measure"): builds decode_bench, writes the
# base model (shared 8000-token vocabulary) and 32 random 32-token sources once, then runs, for a
# few rounds, each round in this order and on the same files and thread count:
#   greedy:  bench/decode_bench --beam 1                      (tfm::search, KV-cached)
#            bench/decode_peer.py --impl nn-transformer       (stock nn.Transformer, no cache)
#            bench/decode_peer.py --impl cached --beam 1      (KV-cached torch.nn.functional loop)
#   beam 4:  bench/decode_bench --beam 4
#            bench/decode_peer.py --impl cached --beam 4
# Every output is forced to exactly 32 tokens on every side (eos masked until 32 tokens, stop at
# 32), so each batch generates 32 × 32 = 1024 target tokens. It checks that greedy outputs are
# the same token sequences on all sides for at least 90% of the sentences, and writes
# bench/results/decode.{md,json}: medians, target tokens/s, ratios, peak RSS, MFU against each
# side's own GEMM peak, and where our time goes (--profile).
#
# usage: bench/run_decode_bench.sh        (from anywhere; installs packages and builds as needed)
# env:   OMP_NUM_THREADS (default 2)  ROUNDS (3)  REPEATS (5: timed batches per run)
#        NOCACHE_REPEATS (1: the no-cache nn.Transformer peer is slow)  WARMUP (1)
#        PHASE_REPEATS (3: --profile replays)  QUIET_WAIT (30: seconds to wait for other
#        processes to go idle before each run)  BUILD_DIR (build)
#        WORK_DIR (a fresh temp dir, removed at the end unless given)
#        PEERS_VENV (where bench/peers.sh installs the peers)
# Takes about 4 minutes on 2 cores when the machine is otherwise idle (plus up to QUIET_WAIT
# seconds before each of the 15 runs when it is not).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-3}
repeats=${REPEATS:-5}
nocache_repeats=${NOCACHE_REPEATS:-1}
warmup=${WARMUP:-1}
phase_repeats=${PHASE_REPEATS:-3}
quiet_wait=${QUIET_WAIT:-30}
build=${BUILD_DIR:-build}
results=bench/results
beam=4

fail() { echo "error: $*" >&2; exit 1; }

source bench/common.sh
bench_prepare decode_bench

if [[ -n "${WORK_DIR:-}" ]]; then
  work=$WORK_DIR
  mkdir -p "$work"
else
  work=$(mktemp -d /tmp/decode_bench.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi

# This machine is shared: around each run, record the whole machine's busy CPU time (/proc/stat,
# in clock ticks) and the wall time, so that the summary can subtract the run's own CPU time
# (cpu_s in its JSON line) and report how many cores other processes took meanwhile.
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
measured() {  # measured NAME command...: appends the JSON line to NAME.jsonl, "busy_ticks start end" to NAME.load
  local name=$1 b0 t0
  shift
  b0=$(busy_ticks)
  t0=$(date +%s.%N)
  "$@" >>"$work/$name.jsonl" || return 1
  echo "$(( $(busy_ticks) - b0 )) $t0 $(date +%s.%N)" >>"$work/$name.load"
}

# Before each run, wait (up to QUIET_WAIT seconds) for a second in which other processes use
# less than 0.2 of a core: two OpenMP threads on two cores slow down several-fold when a third
# process takes one of them.
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
"$bench_bin" --work-dir "$work" --prepare-only 2>/dev/null || fail "decode_bench --prepare-only failed"
sides=(ours_greedy torch_nocache_greedy torch_cached_greedy ours_beam torch_cached_beam
       ours_greedy_bf16 ours_beam_bf16)
for side in "${sides[@]}"; do : >"$work/$side.jsonl"; : >"$work/$side.load"; done
# `translate --compute-type bfloat16` too, where the CPU has AVX512-BF16 (decode_bench refuses
# otherwise, and the report leaves it out).
bf16=1
ours=("$bench_bin" --work-dir "$work" --warmup "$warmup" --repeats "$repeats" --profile
      --phase-repeats "$phase_repeats")
peer=("$python" bench/decode_peer.py --work-dir "$work" --warmup "$warmup")
for round in $(seq 1 "$rounds"); do
  wait_quiet
  measured ours_greedy "${ours[@]}" --beam 1 || fail "decode_bench --beam 1 failed in round $round"
  wait_quiet
  # The no-cache peer warms up on a 4-token decode: its full decode takes many seconds.
  measured torch_nocache_greedy "${peer[@]}" --impl nn-transformer --repeats "$nocache_repeats" \
    --warmup-len 4 || fail "decode_peer.py --impl nn-transformer failed in round $round"
  wait_quiet
  measured torch_cached_greedy "${peer[@]}" --impl cached --beam 1 --repeats "$repeats" ||
    fail "decode_peer.py --impl cached --beam 1 failed in round $round"
  wait_quiet
  measured ours_beam "${ours[@]}" --beam "$beam" || fail "decode_bench --beam $beam failed in round $round"
  wait_quiet
  measured torch_cached_beam "${peer[@]}" --impl cached --beam "$beam" --repeats "$repeats" ||
    fail "decode_peer.py --impl cached --beam $beam failed in round $round"
  if ((bf16)); then
    for b in 1 "$beam"; do
      side=ours_greedy_bf16
      [ "$b" = 1 ] || side=ours_beam_bf16
      wait_quiet
      measured "$side" "${ours[@]}" --beam "$b" --compute-type bfloat16 2>/dev/null ||
        { echo "no bfloat16 runs: this CPU lacks AVX512-BF16" >&2; bf16=0; break; }
    done
  fi
  echo "round $round/$rounds done ($(( $(date +%s) - start )) s)" >&2
done

mkdir -p "$results"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src 2>/dev/null; then commit="$commit+dirty"; fi
load=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$(( $(date +%s) - start ))

"$python" - "$work" "$results" "$cpu" "$commit" "$load" "$ticks_per_s" "$elapsed" <<'EOF'
import datetime, json, statistics, sys

work, results, cpu, commit, load, ticks_per_s, elapsed = sys.argv[1:8]
noise_limit = 0.2    # cores other processes may take during a run for its round to count as clean
min_identical = 0.9  # greedy outputs: fraction of sentences that must be the same on every side
ct2 = {"version": "4.8.1", "greedy_tokens_per_s": 797, "beam4_tokens_per_s": 452}  # issue, elsewhere

def read_runs(side):
    runs = [json.loads(line) for line in open(f"{work}/{side}.jsonl") if line.strip()]
    for run, line in zip(runs, open(f"{work}/{side}.load")):
        ticks, t0, t1 = line.split()
        wall = float(t1) - float(t0)
        # Cores' worth of CPU other processes used during this run (noise on a shared machine).
        run["other_cores"] = max(0.0, (int(ticks) / float(ticks_per_s) - run["cpu_s"]) / wall)
    return runs

runs = {side: read_runs(side) for side in
        ("ours_greedy", "torch_nocache_greedy", "torch_cached_greedy", "ours_beam", "torch_cached_beam")}
bf16_runs = {side: read_runs(side) for side in ("ours_greedy_bf16", "ours_beam_bf16")}
if any(len(r) != len(runs["ours_greedy"]) for r in bf16_runs.values()):
    bf16_runs = {}  # no AVX512-BF16 (or a failed run): the report leaves bfloat16 out
cases = {"greedy": ["ours_greedy", "torch_nocache_greedy", "torch_cached_greedy"],
         "beam4": ["ours_beam", "torch_cached_beam"]}
names = {"ours_greedy": "transformer-cpp (tfm::search, beam 1)",
         "torch_nocache_greedy": "PyTorch nn.Transformer, no cache",
         "torch_cached_greedy": "PyTorch KV-cached loop (F.*)",
         "ours_beam": "transformer-cpp (tfm::search, beam 4)",
         "torch_cached_beam": "PyTorch KV-cached loop (F.*), beam 4"}
rounds = len(runs["ours_greedy"])

def summary(side, used):
    rs = [runs[side][i] for i in used]
    med = lambda key: statistics.median(r[key] for r in rs)
    out = {"name": names[side], "impl": rs[0]["impl"], "runs": len(rs), "threads": rs[0]["threads"],
           "beam": rs[0]["beam"], "repeats_per_run": rs[0]["repeats"],
           "median_s": med("median_s"), "tokens_per_s": med("tokens_per_s"),
           "peak_rss_mib": max(r["peak_rss_mib"] for r in rs), "load_s": med("load_s"),
           "gflops": med("gflops"), "gemm_peak_gflops": med("gemm_peak_gflops"), "mfu": med("mfu"),
           "all_rounds": [{"tokens_per_s": r["tokens_per_s"], "median_s": r["median_s"],
                           "run_s": r["run_s"], "gemm_peak_gflops": r["gemm_peak_gflops"],
                           "other_cores": round(r["other_cores"], 2),
                           **({"phases": r["phases"]} if r.get("phases") else {})} for r in runs[side]]}
    if rs[0].get("phases"):
        out["phases"] = {k: statistics.median(r["phases"][k] for r in rs) for k in rs[0]["phases"]}
    if "blas" in rs[0]:
        out["blas"] = rs[0]["blas"]
    return out

def compare(a, b):
    """Fraction of sentences with the same tokens (first run of each side), and the largest
    |difference| of total log-probability among those sentences."""
    oa, ob = runs[a][0], runs[b][0]
    same = [i for i, (x, y) in enumerate(zip(oa["outputs"], ob["outputs"])) if x == y]
    diff = max((abs(oa["logprobs"][i] - ob["logprobs"][i]) for i in same), default=None)
    return {"identical": len(same), "sentences": len(oa["outputs"]),
            "fraction": len(same) / len(oa["outputs"]), "logprob_max_abs_diff": diff}

# Every run of a side must produce the same outputs as its first run (deterministic decoding).
for side, rs in runs.items():
    for r in rs[1:]:
        if r["outputs"] != rs[0]["outputs"]:
            print(f"warning: {side}: outputs differ between rounds", file=sys.stderr)

report = {
    "benchmark": "decoding (encoder + search) of 32 random 32-token sources, base model, shared "
                 "vocab 8000, every output forced to 32 tokens",
    "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    "cpu": cpu, "commit": commit, "threads": runs["ours_greedy"][0]["threads"],
    "load_average_after": load, "elapsed_s": int(elapsed),
    "batch": runs["ours_greedy"][0]["batch"], "src_len_with_eos": runs["ours_greedy"][0]["src_len"],
    "out_len": runs["ours_greedy"][0]["out_len"], "target_tokens": runs["ours_greedy"][0]["target_tokens"],
    "rounds": rounds, "noise_limit_cores": noise_limit,
    "ctranslate2_measured_elsewhere": ct2,
    "cases": {},
}
noisy_cases = []
for case, sides in cases.items():
    # A round counts as clean for a case when other processes took under noise_limit of a core
    # during each of the case's runs in it; medians over the clean rounds when there is one.
    clean = [i for i in range(rounds) if all(runs[s][i]["other_cores"] <= noise_limit for s in sides)]
    used = clean or list(range(rounds))
    if not clean:
        noisy_cases.append(case)
    entry = {"rounds_used": [i + 1 for i in used], "noisy": not clean,
             "sides": {s: summary(s, used) for s in sides}}
    ours = entry["sides"][sides[0]]
    for peer in sides[1:]:
        p = entry["sides"][peer]
        p["ratio_ours_over_this"] = ours["tokens_per_s"] / p["tokens_per_s"]
        p["ratio_each_round"] = [runs[sides[0]][i]["tokens_per_s"] / runs[peer][i]["tokens_per_s"]
                                 for i in range(rounds)]
        p["outputs_vs_ours"] = compare(sides[0], peer)
    report["cases"][case] = entry
greedy = report["cases"]["greedy"]["sides"]
greedy_ok = all(greedy[p]["outputs_vs_ours"]["fraction"] >= min_identical
                for p in ("torch_nocache_greedy", "torch_cached_greedy"))
report["greedy_peers_agree"] = compare("torch_nocache_greedy", "torch_cached_greedy")
report["greedy_min_identical_fraction"] = min_identical
report["greedy_outputs_ok"] = greedy_ok
report["noisy_cases"] = noisy_cases

# bfloat16 weights: medians over all rounds, compared with our float32 side and the peers of the
# same rounds.
bfloat16 = {}
for case, side, fp32 in (("greedy", "ours_greedy_bf16", "ours_greedy"),
                         ("beam4", "ours_beam_bf16", "ours_beam")):
    if not bf16_runs:
        break
    rs = bf16_runs[side]
    tps = statistics.median(r["tokens_per_s"] for r in rs)
    fp32_runs = runs[fp32]
    same = [i for i, (x, y) in enumerate(zip(rs[0]["outputs"], fp32_runs[0]["outputs"])) if x == y]
    entry = {"tokens_per_s": tps, "median_s": statistics.median(r["median_s"] for r in rs),
             "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
             "over_float32_each_round": [r["tokens_per_s"] / f["tokens_per_s"] for r, f in zip(rs, fp32_runs)],
             "outputs_identical_to_float32": len(same), "sentences": len(rs[0]["outputs"]),
             "logprob_max_abs_diff_of_identical": max((abs(rs[0]["logprobs"][i] - fp32_runs[0]["logprobs"][i])
                                                      for i in same), default=None),
             "phases": {k: statistics.median(r["phases"][k] for r in rs) for k in rs[0]["phases"]}
                       if rs[0].get("phases") else None}
    for peer in cases[case][1:]:
        entry[f"over_{peer}_each_round"] = [r["tokens_per_s"] / q["tokens_per_s"] for r, q in zip(rs, runs[peer])]
    bfloat16[case] = entry
report["bfloat16"] = bfloat16

with open(f"{results}/decode.json", "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

def rounds_note(case):
    e = report["cases"][case]
    return ("**noisy: every round had other processes over %.1f of a core**" % noise_limit if e["noisy"]
            else "medians over clean rounds %s of %d" % (", ".join(map(str, e["rounds_used"])), rounds))

def table(case):
    e = report["cases"][case]
    lines = ["| | target tokens/s | median s/batch | ours / this | peak RSS MiB | GFLOP/s | GEMM peak GFLOP/s | MFU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for side, s in e["sides"].items():
        ratio = "%.2f× (rounds: %s)" % (s["ratio_ours_over_this"], ", ".join("%.2f" % r for r in s["ratio_each_round"])) \
            if "ratio_ours_over_this" in s else "—"
        lines.append(f"| {s['name']} | {s['tokens_per_s']:.0f} | {s['median_s']:.3f} | {ratio} | "
                     f"{s['peak_rss_mib']:.0f} | {s['gflops']:.0f} | {s['gemm_peak_gflops']:.0f} | {s['mfu']:.3f} |")
    return "\n".join(lines)

def others(case):
    e = report["cases"][case]
    return "; ".join(f"{s['name'].split(' (')[0] if side.startswith('ours') else s['name']}: "
                     + ", ".join("%.2f" % r["other_cores"] for r in s["all_rounds"])
                     for side, s in e["sides"].items())

def outputs_line(peer):
    c = greedy[peer]["outputs_vs_ours"]
    d = c["logprob_max_abs_diff"]
    return (f"{c['identical']}/{c['sentences']} identical ({100 * c['fraction']:.0f}%)"
            + (f", total log-prob of those within {d:.1e}" if d is not None else ""))

def profile(case, side):
    ph = report["cases"][case]["sides"][side].get("phases")
    if not ph:
        return "| – | – | – | – | – | – | – |"
    total = report["cases"][case]["sides"][side]["median_s"]
    cells = [ph[k] for k in ("encoder_s", "decoder_setup_s", "decoder_steps_s", "projection_in_steps_s",
                             "reorder_s", "bookkeeping_s")]
    pct = lambda v: f"{v:.3f} ({100 * v / total:.0f}%)"
    return f"| beam {report['cases'][case]['sides'][side]['beam']} | {total:.3f} | " + " | ".join(pct(v) for v in cells) + " |"

def bfloat16_section():
    if not bfloat16:
        return "(No bfloat16 runs: this CPU lacks AVX512-BF16.)\n"
    med = lambda v: statistics.median(v)
    rows = []
    for case, label in (("greedy", "greedy"), ("beam4", "beam 4")):
        b = bfloat16[case]
        peers = " / ".join(f"{med(b[f'over_{p}_each_round']):.2f}×" for p in cases[case][1:])
        d = b["logprob_max_abs_diff_of_identical"]
        rows.append(f"| {label} | {b['tokens_per_s']:.0f} | {med(b['over_float32_each_round']):.2f}× | {peers} | "
                    f"{b['peak_rss_mib']:.0f} | {b['outputs_identical_to_float32']}/{b['sentences']}"
                    + (f", log-prob within {d:.2f}" if d is not None else "") + " |")
    return f"""## bfloat16 weights (`translate --compute-type bfloat16`)

The decoder's weight products in bfloat16 (weights packed once, activations rounded at each
product, float32 accumulation; the encoder stays float32), same runs as above. Ratios are
medians over all rounds of the per-round ratios.

| | target tokens/s | over our float32 | over the peers (greedy: nn.Transformer / cached loop; beam: cached loop) | peak RSS MiB | outputs identical to float32 |
|---|---:|---:|---:|---:|---|
""" + "\n".join(rows) + "\n"

beam_c = report["cases"]["beam4"]["sides"]["torch_cached_beam"]["outputs_vs_ours"]
blas = greedy["torch_cached_greedy"].get("blas", "?")
torch_version = greedy["torch_cached_greedy"]["impl"].split("-", 1)[1]
md = f"""# Decoding benchmark (`bench/run_decode_bench.sh`)

{report['date']} · {cpu} · {report['threads']} threads · commit {commit}

Decoding with the base model (d_model 512, 6+6 layers, post-norm, relu, one shared 8000-token
embedding tied to the output projection; random initialisation, the same model file on every
side): one batch of {report['batch']} random sources × 32 tokens (+ eos), timed from token ids to
output tokens (encoder included). Every output is forced to exactly {report['out_len']} tokens on every
side (eos masked until {report['out_len']} tokens, stop at {report['out_len']}), so a batch generates
{report['target_tokens']} target tokens. {rounds} rounds, each: ours greedy, nn.Transformer greedy,
cached-PyTorch greedy, ours beam 4, cached-PyTorch beam 4 (separate processes, so peak RSS is
each one's own); each run: {runs['ours_greedy'][0]['warmup']} warm-up + {runs['ours_greedy'][0]['repeats']} timed batches
({runs['torch_nocache_greedy'][0]['repeats']} for the no-cache peer, whose warm-up decodes 4 tokens).
GFLOP/s counts the useful work of a KV-cached search ({runs['ours_greedy'][0]['gflop']:.0f} GFLOP greedy,
{runs['ours_beam'][0]['gflop']:.0f} GFLOP beam 4) for every side; MFU is against the square
{runs['ours_greedy'][0]['gemm_size']}³ fp32 GEMM each process measured itself (the faster of oneDNN's sgemm and matmul for ours, torch.mm →
{blas} for PyTorch {torch_version}).

## Greedy ({rounds_note('greedy')})

{table('greedy')}

Same outputs as ours (same weights, greedy): nn.Transformer {outputs_line('torch_nocache_greedy')};
cached loop {outputs_line('torch_cached_greedy')} (required: ≥ {100 * min_identical:.0f}% for both:
{'ok' if greedy_ok else '**FAILED**'}).

## Beam 4 ({rounds_note('beam4')})

{table('beam4')}

Best hypotheses identical to ours: {beam_c['identical']}/{beam_c['sentences']} ({100 * beam_c['fraction']:.0f}%){f", total log-prob of those within {beam_c['logprob_max_abs_diff']:.1e}" if beam_c['logprob_max_abs_diff'] is not None else ""}.
Ranking by cumulative log-probability (all hypotheses have the same length, so the length
penalty does not matter); step 1 runs one hypothesis per sentence, the other 31 steps four.

For context only — **measured elsewhere, not in this run** (another machine): CTranslate2
{ct2['version']} fp32 at exactly these shapes, greedy {ct2['greedy_tokens_per_s']} tokens/s, beam 4 {ct2['beam4_tokens_per_s']} tokens/s.

{bfloat16_section()}
## Where our time goes (`decode_bench --profile`)

tfm::search has no hooks, so `--profile` replays its decoder calls with the public pieces on
the same shapes and times each: make_batch + encoder_forward; the decoder setup (the
IncrementalDecoder's constructor, which computes every layer's cross-attention keys/values and
reserves the self-attention caches, and start()); {report['out_len']} steps;
the reorder the search calls after every step but the last (greedy included, with identity
parents; it copies history indices, not cache rows). The vocabulary projection +
log-softmax inside the steps is timed alone on the same kernels and shapes. Bookkeeping = the
search's median − everything else (per-hypothesis partial sort of the vocabulary, hypothesis
copies). Seconds per batch (share of the search's median):

| | search s | encoder | decoder setup | decoder steps | of which projection | cache reorder | bookkeeping |
|---|---:|---:|---:|---:|---:|---:|---:|
{profile('greedy', 'ours_greedy')}
{profile('beam4', 'ours_beam')}

## Noise

Other processes' CPU during each run, in cores (machine busy time minus the run's own), per round:
greedy — {others('greedy')}; beam 4 — {others('beam4')}.
Load average after the run: {load}. The whole script took {elapsed} s.
The no-cache peer re-runs the decoder on the whole prefix every step (32 × 33 / 2 = 528 decoder
positions per sentence instead of 32), so its FLOP-based MFU is not comparable: it does ~16× the
decoder work counted. Peak RSS is ru_maxrss after the timed batches (PyTorch's includes the
interpreter and libtorch; ours includes loading the 193 MB model file).
"""
with open(f"{results}/decode.md", "w") as f:
    f.write(md)

for case, e in report["cases"].items():
    for side, s in e["sides"].items():
        ratio = f"  ours/this {s['ratio_ours_over_this']:.2f}x" if "ratio_ours_over_this" in s else ""
        print(f"{case:6} {s['name']:42} {s['tokens_per_s']:7.1f} tokens/s  median {s['median_s']:.3f} s  "
              f"RSS {s['peak_rss_mib']:.0f} MiB  MFU {s['mfu']:.3f}{ratio}")
    print(f"{case:6} {rounds_note(case)}; other cores: {others(case)}")
print(f"greedy outputs vs ours: nn.Transformer {outputs_line('torch_nocache_greedy')}; "
      f"cached {outputs_line('torch_cached_greedy')}")
print(f"beam 4 best hypotheses vs ours: {beam_c['identical']}/{beam_c['sentences']}")
for case, side in (("greedy", "ours_greedy"), ("beam4", "ours_beam")):
    ph = report["cases"][case]["sides"][side].get("phases")
    if ph:
        print(f"profile {case}: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))
print(f"wrote {results}/decode.md and {results}/decode.json")
if noisy_cases:
    print(f"warning: {', '.join(noisy_cases)}: every round had other processes over {noise_limit} of a core; "
          "the numbers are noisy", file=sys.stderr)
if not greedy_ok:
    print(f"error: greedy outputs differ from ours for more than {100 * (1 - min_identical):.0f}% of the "
          "sentences: the sides do not compute the same thing", file=sys.stderr)
    sys.exit(1)
EOF
