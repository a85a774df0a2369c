#!/usr/bin/env bash
# README's first command. Until `train` and `translate` land, the main job is what the engine
# can do end to end today: build, describe the paper's models, import a real model that
# CTranslate2 trained (its Arabic→English transliteration test model) and score text with it,
# then build and score a randomly initialised model of our own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
bin=build/transformer
out=out/quickstart
mkdir -p "$out"

echo "== the paper's base model with a 37,000-token shared vocabulary (Table 3: 65M)"
$bin info --preset base --vocab 37000 | grep -A3 '^parameters'

echo
echo "== import CTranslate2's transliteration model and score two pairs with it"
$bin import-ctranslate2 tests/data/ctranslate2-aren-transliteration/aren-transliteration -o "$out/aren"
printf 'آ ت ز م و ن\nآ ت ش ي س و ن\n' > "$out/ar.txt"
printf 'a t z m o n\na c h i s o n\n' > "$out/en.txt"
echo "log p(target + eos | source), then per token:"
$bin score --model "$out/aren" --src "$out/ar.txt" --tgt "$out/en.txt" --per-token

echo
echo "== a random tiny model scored on token ids (what tests and benchmarks use)"
$bin init --preset tiny --vocab 1000 --seed 1 -o "$out/tiny.safetensors"
printf '5 6 7 8\n9 10\n' > "$out/src.ids"
printf '11 12 13\n14\n' > "$out/tgt.ids"
$bin score --model "$out/tiny.safetensors" --ids --src "$out/src.ids" --tgt "$out/tgt.ids"
echo
echo "outputs are in $out/"
