#!/usr/bin/env bash
# Same-run comparison of two commits of the engine, so that a refactor proves it lost nothing
# (docs/performance.md, "How we measure": ratios measured in one run, never against a figure from elsewhere). Builds the
# score, train and decode benches of OLD and NEW in git worktrees, writes one base model and one
# batch, then runs every case for both commits, ROUNDS times, swapping which commit goes first
# each round, on the same files and thread count:
#   score        bench/score_bench  (teacher-forced scoring, base, 32 × 32 tokens)
#   train        bench/train_bench  (one training step, base, 64 pairs of 31 tokens)
#   train_bf16   bench/train_bench --compute-type bfloat16   (CPUs with AVX512-BF16)
#   greedy       bench/decode_bench --beam 1   (32 sources × 32 tokens, outputs forced to 32)
#   beam4        bench/decode_bench --beam 4
#   greedy_bf16  bench/decode_bench --beam 1 --compute-type bfloat16   (CPUs with AVX512-BF16)
#   beam4_bf16   bench/decode_bench --beam 4 --compute-type bfloat16
#   greedy_int8  bench/decode_bench --beam 1 --compute-type int8   (the model quantised at load)
#   beam4_int8   bench/decode_bench --beam 4 --compute-type int8
#   train_corpus `transformer train --preset small` on the quickstart corpus (out/corpus, made
#                by the quickstart or scripts/prepare_corpus.py), bfloat16 where the CPU has
#                AVX512-BF16, TRAIN_STEPS steps (700: into the second epoch, where batch shapes
#                come again), whole process timed: real batches of every length, unlike
#                train_bench's one shape; not in the default cases (~3 minutes a run)
#   train_corpus_60  the same with the 60-minute quickstart's regularisation (attention and
#                feed-forward dropout 0.1, label smoothing 0.2); not in the default cases
# and reports, per case, speed new/old (old median time / new median time; > 1: new is faster),
# peak RSS of each, for decoding whether the outputs are the same token sequences, and for
# training whether the loss after the timed steps is the same number. Writes
# bench/results/compare_commits.{md,json}.
#
# usage: bench/run_compare_commits.sh OLD [NEW]     (commits; NEW defaults to HEAD)
# env:   OMP_NUM_THREADS (default 2)  ROUNDS (3)  REPEATS (5)  CASES (the first nine, space-separated)
#        TRAIN_STEPS (700, train_corpus)
#        WORK_DIR (out/compare_commits: worktrees and builds are kept there and reused)
# Takes about 8 minutes of building per commit, then about 2 minutes per round on 2 cores.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: bench/run_compare_commits.sh OLD [NEW]" >&2; exit 2; }
fail() { echo "error: $*" >&2; exit 1; }
old=$(git rev-parse --verify --short "$1^{commit}") || fail "$1 is not a commit"
new=$(git rev-parse --verify --short "${2:-HEAD}^{commit}") || fail "${2:-HEAD} is not a commit"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rounds=${ROUNDS:-3}
repeats=${REPEATS:-5}
cases=(${CASES:-score train train_bf16 greedy beam4 greedy_bf16 beam4_bf16 greedy_int8 beam4_int8})
train_corpus_wanted=0
[[ " ${cases[*]} " =~ " train_corpus"(_60)?" " ]] && train_corpus_wanted=1
work=${WORK_DIR:-out/compare_commits}
python=/usr/bin/python3
mkdir -p "$work"
work=$(cd "$work" && pwd)

bash scripts/bootstrap.sh >/dev/null

# One worktree and Release build with benchmarks per commit, reused by later runs.
build_commit() {
  local sha=$1 tree="$work/tree-$1"
  if [[ ! -d "$tree" ]]; then
    git worktree add --detach "$tree" "$sha" >/dev/null 2>&1 || fail "git worktree add $sha failed"
  fi
  # The fixtures and data the build reads live beside the checkout, as in CI.
  [[ -e "$work/shared" ]] || ln -s "$repo/../shared" "$work/shared"
  cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DTRANSFORMER_BENCH=ON \
    >/dev/null || fail "configuring $sha failed"
  local targets=(score_bench train_bench decode_bench)
  ((train_corpus_wanted)) && targets+=(transformer_cli)
  cmake --build "$tree/build" --target "${targets[@]}" -j2 >/dev/null ||
    fail "building the benches of $sha failed"
}
corpus=$repo/out/corpus
if ((train_corpus_wanted)); then
  [[ -f $corpus/train.en && -f $corpus/train.es ]] ||
    fail "train_corpus needs the quickstart corpus: /usr/bin/python3 scripts/prepare_corpus.py --out out/corpus"
fi
echo "building $old and $new" >&2
build_commit "$old"
build_commit "$new"

# The same model and batches for both commits, written by NEW's benches.
data="$work/data"
mkdir -p "$data/score" "$data/decode"
"$work/tree-$new/build/bench/score_bench" --work-dir "$data/score" --prepare-only 2>/dev/null ||
  fail "score_bench --prepare-only failed"
"$work/tree-$new/build/bench/decode_bench" --work-dir "$data/decode" --prepare-only 2>/dev/null ||
  fail "decode_bench --prepare-only failed"

bf16=1
grep -q avx512_bf16 /proc/cpuinfo || bf16=0
if ((train_corpus_wanted)) && [[ ! -f $data/corpus_vocab.spm ]]; then
  "$work/tree-$new/build/transformer" vocab --input "$corpus/train.en" "$corpus/train.es" \
    --size 8000 -o "$data/corpus_vocab.spm" >/dev/null 2>&1 || fail "transformer vocab failed"
fi
# One training run of the small preset on the corpus as a JSON line like the benches' (median_s:
# the whole process; loss_last: the last logged training loss).
train_corpus() {  # train_corpus BIN [more train options]
  local bin=$1 run="$data/train_corpus_run" type=float32 steps=${TRAIN_STEPS:-700}
  shift
  ((bf16)) && type=bfloat16
  rm -rf "$run"
  /usr/bin/time -f '%e %M' -o "$data/train_corpus.time" "$bin" train --model-dir "$run" \
    --train-src "$corpus/train.en" --train-tgt "$corpus/train.es" \
    --vocabs "$data/corpus_vocab.spm" --preset small --compute-type "$type" \
    --max-steps "$steps" --batch-tokens 4096 --save-every 0 --valid-every 0 \
    --log-every $((steps < 100 ? steps : 100)) --dropout 0.1 --seed 1 "$@" >/dev/null 2>&1 ||
    return 1
  "$python" - "$data/train_corpus.time" "$run/train.log.jsonl" "$OMP_NUM_THREADS" <<'PY'
import json, sys
seconds, rss_kib = open(sys.argv[1]).read().split()[-2:]
steps = [e for e in map(json.loads, open(sys.argv[2])) if e.get("event") == "train"]
print(json.dumps({"median_s": float(seconds), "peak_rss_mib": int(rss_kib) / 1024,
                  "loss_last": steps[-1]["loss"], "steps": steps[-1]["step"],
                  "threads": int(sys.argv[3])}))
PY
}
run_case() {  # run_case CASE SHA: one JSON line on stdout
  local bin="$work/tree-$2/build/bench"
  case $1 in
    score) "$bin/score_bench" --work-dir "$data/score" --reuse --repeats "$repeats" --phase-repeats 0 ;;
    train) "$bin/train_bench" --steps "$repeats" ;;
    train_bf16) "$bin/train_bench" --steps "$repeats" --compute-type bfloat16 ;;
    greedy) "$bin/decode_bench" --work-dir "$data/decode" --beam 1 --repeats "$repeats" ;;
    beam4) "$bin/decode_bench" --work-dir "$data/decode" --beam 4 --repeats "$repeats" ;;
    greedy_bf16) "$bin/decode_bench" --work-dir "$data/decode" --beam 1 --repeats "$repeats" \
      --compute-type bfloat16 ;;
    beam4_bf16) "$bin/decode_bench" --work-dir "$data/decode" --beam 4 --repeats "$repeats" \
      --compute-type bfloat16 ;;
    greedy_int8) "$bin/decode_bench" --work-dir "$data/decode" --beam 1 --repeats "$repeats" \
      --compute-type int8 ;;
    beam4_int8) "$bin/decode_bench" --work-dir "$data/decode" --beam 4 --repeats "$repeats" \
      --compute-type int8 ;;
    train_corpus) train_corpus "$work/tree-$2/build/transformer" ;;
    train_corpus_60) train_corpus "$work/tree-$2/build/transformer" --attention-dropout 0.1 \
      --relu-dropout 0.1 --label-smoothing 0.2 ;;
    *) fail "unknown case $1" ;;
  esac
}

runs="$work/runs.jsonl"
: >"$runs"
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  order=("$old" "$new")
  ((round % 2)) || order=("$new" "$old")
  for c in "${cases[@]}"; do
    [[ $c == *_bf16 && $bf16 == 0 ]] && continue
    for sha in "${order[@]}"; do
      side=new
      [[ $sha == "$old" ]] && side=old
      line=$(run_case "$c" "$sha" 2>/dev/null) || fail "$c of $sha failed in round $round"
      echo "{\"case\": \"$c\", \"side\": \"$side\", \"round\": $round, \"run\": $line}" >>"$runs"
    done
  done
  echo "round $round/$rounds done ($(( $(date +%s) - start )) s)" >&2
done

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"$python" - "$runs" bench/results "$old" "$new" "$cpu" "$bf16" <<'EOF'
import datetime, json, statistics, sys

runs_path, results, old, new, cpu, bf16 = sys.argv[1:7]
runs = [json.loads(line) for line in open(runs_path) if line.strip()]
cases = []
for r in runs:
    if r["case"] not in cases:
        cases.append(r["case"])
report = {"benchmark": "same-run comparison of two commits (bench/run_compare_commits.sh)",
          "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "cpu": cpu, "old": old, "new": new, "threads": runs[0]["run"].get("threads"),
          "avx512_bf16": bf16 == "1", "cases": {}}
rows = []
for case in cases:
    side = {s: [r["run"] for r in runs if r["case"] == case and r["side"] == s]
            for s in ("old", "new")}
    median = {s: statistics.median(x["median_s"] for x in side[s]) for s in side}
    rss = {s: max(x["peak_rss_mib"] for x in side[s]) for s in side}
    # The fastest repeat of each side (min_s, where the bench reports it): on a machine whose
    # speed wanders (a VM on a shared host: per-run medians 25% apart on 2026-12-01) the ratio of
    # the fastest runs resolves what the medians cannot; the spread says how far they wander.
    fastest = {s: min(x.get("min_s", x["median_s"]) for x in side[s]) for s in side}
    spread = max(max(x["median_s"] for x in side[s]) / min(x["median_s"] for x in side[s])
                 for s in side)
    entry = {"old_median_s": median["old"], "new_median_s": median["new"],
             "speed_new_over_old": median["old"] / median["new"],
             "old_peak_rss_mib": rss["old"], "new_peak_rss_mib": rss["new"],
             "rounds": len(side["new"]),
             "old_fastest_s": fastest["old"], "new_fastest_s": fastest["new"],
             "speed_fastest_new_over_old": fastest["old"] / fastest["new"],
             "spread_of_run_medians": spread,
             "all_old_s": [x["median_s"] for x in side["old"]],
             "all_new_s": [x["median_s"] for x in side["new"]]}
    same = ""
    if "outputs" in side["new"][0]:
        a, b = side["old"][0]["outputs"], side["new"][0]["outputs"]
        entry["identical_outputs"] = sum(x == y for x, y in zip(a, b))
        entry["sentences"] = len(a)
        same = f"{entry['identical_outputs']}/{entry['sentences']}"
    elif "loss_last" in side["new"][0]:
        entry["same_loss"] = side["old"][0]["loss_last"] == side["new"][0]["loss_last"]
        same = "same loss" if entry["same_loss"] else "loss differs"
    report["cases"][case] = entry
    rows.append(f"| {case} | {median['old']*1e3:.1f} | {median['new']*1e3:.1f} | "
                f"{entry['speed_new_over_old']:.3f} | {entry['speed_fastest_new_over_old']:.3f} | "
                f"{spread:.2f} | {rss['old']:.0f} | {rss['new']:.0f} | {same} |")

json.dump(report, open(f"{results}/compare_commits.json", "w"), indent=1)
md = [f"# {old} → {new}, same run",
      "",
      f"{report['date']}, {cpu}, {report['threads']} threads, {len(runs) // (2 * len(cases))} "
      "rounds (commits alternating); medians of each side's per-run medians. Fastest: the ratio of "
      "each side's fastest repeat; spread: the largest side's slowest per-run median over its "
      "fastest (well above 1: the machine's speed wandered, and the fastest runs say more).",
      "",
      "| case | old ms | new ms | speed new/old | fastest new/old | spread | old peak RSS MiB | new peak RSS MiB | same outputs |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
      *rows,
      "",
      "Reproduce: `bash bench/run_compare_commits.sh " + old + " " + new + "`."]
open(f"{results}/compare_commits.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
