#!/usr/bin/env bash
# The paper's claims about attention (§3.2.1, §3.2.2), measured end to end and re-runnable:
#   speed     one attention function (one head of size d_k, one sequence of n positions) for
#             n = 32 … 1024 and d_k = 16 … 256: scaled dot product vs additive attention, forward
#             and forward+backward time and peak heap memory, one thread each
#             (attention_claims_bench --mode speed)
#   variance  q·k of random unit-variance q, k at d_k = 16 … 512: its variance, the softmax's
#             entropy and the gradient norm reaching the queries, scaled vs unscaled vs additive
#             (attention_claims_bench --mode variance)
#   heads     one multi-head attention layer of the small model (d_model 256) with h = 1 … 16:
#             time and FLOPs, forward and forward+backward (attention_claims_bench --mode heads),
#             and whole training steps of the small model at each h (train_bench --config)
#   quality   small-preset models (d_model 256, 3+3 layers) trained on the quickstart corpus for
#             the same number of steps: scaled_dot / dot / additive at h = 8, 4, 2 (d_k 32, 64,
#             128: heads vary at fixed d_model, so every model has the same size apart from
#             additive's h·d_k vectors), plus scaled_dot at h = 1 and 16 for the heads row; two
#             seeds each; dev perplexity curve, greedy Acts BLEU and seconds per step per run
#   report    bench/results/attention_claims.{md,json} and attention_claims_*.png (gnuplot)
# Stages run in this order; `all` (default) runs every one. Quality runs are resumable: a
# finished run (its bleu.txt) is kept, so an interrupted script picks up where it stopped.
#
# usage: bench/run_attention_claims.sh [all|speed|variance|heads|quality|report]...
# env:   STEPS (240)  BATCH_TOKENS (2048)  WARMUP (120)  VALID_EVERY (40)  SEEDS ("1 2")
#        OMP_NUM_THREADS (2)  BUILD_DIR (build)  WORK (out/attention_claims)
#        TRANSFORMER_BIN (BUILD_DIR/transformer)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
steps=${STEPS:-240}
batch_tokens=${BATCH_TOKENS:-2048}
warmup=${WARMUP:-120}
valid_every=${VALID_EVERY:-40}
seeds=${SEEDS:-"1 2"}
build=${BUILD_DIR:-build}
work=${WORK:-out/attention_claims}
results=bench/results

fail() { echo "error: $*" >&2; exit 1; }
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(all)
for s in "${stages[@]}"; do
  case $s in all|speed|variance|heads|quality|report) ;; *) fail "unknown stage '$s'" ;; esac
done
wants() { local s; for s in "${stages[@]}"; do [[ $s == all || $s == "$1" ]] && return 0; done; return 1; }

source bench/common.sh
if wants speed || wants variance || wants heads; then
  bench_prepare attention_claims_bench
fi
[ -x "$build/transformer" ] || bash scripts/build.sh >/dev/null
bin=${TRANSFORMER_BIN:-$build/transformer}
mkdir -p "$work" "$results"

if wants speed; then
  echo "== speed: scaled dot vs additive, one head, n x d_k" >&2
  : > "$work/speed.jsonl"
  for n in 32 64 128 256 512 1024; do
    for d_k in 16 32 64 128 256; do
      for kind in scaled_dot additive; do  # one process per case: its own peak heap
        OMP_NUM_THREADS=1 "$bench_bin" --mode speed --kind "$kind" --n "$n" --d-k "$d_k" \
          >> "$work/speed.jsonl"
      done
    done
  done
fi
if wants variance; then
  echo "== variance: q.k at d_k 16..512, scaled vs unscaled" >&2
  "$bench_bin" --mode variance > "$work/variance.jsonl"
fi
if wants heads; then
  echo "== heads: one multi-head attention layer, d_model 256, h = 1..16" >&2
  "$bench_bin" --mode heads > "$work/heads.jsonl"
  echo "== heads: whole training steps of the small model, h = 1..16 (train_bench)" >&2
  cmake --build "$build" --target train_bench -j2 >/dev/null || fail "building train_bench failed"
  : > "$work/heads_steps.jsonl"
  for h in 1 2 4 8 16; do
    printf '{"d_model":256,"heads":%d,"d_ff":1024,"encoder_layers":3,"decoder_layers":3}\n' "$h" \
      > "$work/heads_$h.json"
    "$build/bench/train_bench" --config "$work/heads_$h.json" --batch 32 --src-len 31 \
      --tgt-len 31 --steps 5 --gemm-size 512 >> "$work/heads_steps.jsonl"
  done
fi

if wants quality; then
  corpus=out/corpus
  vocab=$work/vocab.spm
  if [ ! -f "$corpus/train.en" ]; then
    echo "== preparing the quickstart corpus" >&2
    /usr/bin/python3 scripts/prepare_corpus.py --out "$corpus"
  fi
  if [ ! -f "$vocab" ]; then
    "$bin" vocab --input "$corpus/train.en" "$corpus/train.es" --size 8000 -o "$vocab"
  fi
  # The quickstart's learning-rate peak (2e-3), reached after the warm-up.
  lr_factor=$(awk "BEGIN{printf \"%.4f\", 2e-3 * sqrt($warmup) * sqrt(256)}")
  runs=()
  for h in 8 4 2; do
    for kind in scaled_dot dot additive; do runs+=("$kind $h"); done
  done
  runs+=("scaled_dot 1" "scaled_dot 16")
  for run in "${runs[@]}"; do
    read -r kind h <<<"$run"
    for seed in $seeds; do
      dir=$work/runs/${kind}_h${h}_s${seed}
      [ -f "$dir/bleu.txt" ] && continue
      echo "== quality: $kind, $h heads (d_k $((256 / h))), seed $seed, $steps steps" >&2
      rm -rf "$dir"
      mkdir -p "$dir"
      printf '{"d_model":256,"heads":%d,"d_ff":1024,"encoder_layers":3,"decoder_layers":3,"attention":"%s"}\n' \
        "$h" "$kind" > "$dir/config.json"
      start=$(date +%s.%N)
      "$bin" train --model-dir "$dir/model" --config "$dir/config.json" \
        --train-src "$corpus/train.en" --train-tgt "$corpus/train.es" \
        --valid-src "$corpus/dev.en" --valid-tgt "$corpus/dev.es" --vocabs "$vocab" \
        --max-steps "$steps" --warmup "$warmup" --lr-factor "$lr_factor" \
        --batch-tokens "$batch_tokens" --valid-every "$valid_every" --save-every 0 \
        --log-every "$valid_every" --keep 0 --seed "$seed" > "$dir/train.out" 2>&1 ||
        fail "training $dir failed: $(tail -1 "$dir/train.out")"
      end=$(date +%s.%N)
      awk "BEGIN{printf \"%.3f\n\", $end - $start}" > "$dir/train_seconds.txt"
      "$bin" translate --model "$dir/model" --beam 1 -i "$corpus/test.en" -o "$dir/test.hyp.es" \
        2> "$dir/translate.err" || fail "translating with $dir failed"
      "$bin" bleu --ref "$corpus/test.es" -i "$dir/test.hyp.es" > "$dir/bleu.tmp"
      mv "$dir/bleu.tmp" "$dir/bleu.txt"
      head -1 "$dir/bleu.txt" >&2
    done
  done
fi

if wants report; then
  bash scripts/bootstrap.sh gnuplot-nox python3-numpy
  /usr/bin/python3 bench/attention_claims_report.py --work "$work" --results "$results" \
    --steps "$steps" --batch-tokens "$batch_tokens" --warmup "$warmup" --seeds "$seeds"
fi
