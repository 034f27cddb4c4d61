#!/usr/bin/env bash
# The end-to-end demo on the bundled sample (run by `make demo` after set-up):
#   1. train a SentencePiece + KenLM model per language from the sample's reference text
#   2. run the pipeline with perplexity scoring (no cutoffs yet) to get the perplexity distribution
#   3. compute CCNet-layout cutoff.csv from it
#   4. run the pipeline again with head/middle/tail buckets
# Each step is skipped when its output is already there and newer than what it is built from;
# FORCE=1 redoes every step (the outputs are byte-identical: same input and config, same bytes).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-out/demo}
CONFIG=configs/corpus/sample.yaml

FORCE=${FORCE:-0}
LM_FLAGS=()
[[ "$FORCE" == 1 ]] && LM_FLAGS=(--overwrite)

fresh() {  # fresh OUTPUT INPUT...: true when OUTPUT exists and is newer than every INPUT
  local out=$1; shift
  [[ "$FORCE" == 1 ]] && return 1
  [[ -e "$out" ]] || return 1
  for input in "$@"; do [[ "$input" -nt "$out" ]] && return 1; done
  return 0
}

step() { echo; echo "== $*"; }

step "1/4 language models -> $OUT/lm"
$PY -m pipeline train-lm --config configs/lm/sample.yaml --out "$OUT/lm" "${LM_FLAGS[@]}"

step "2/4 perplexity scoring -> $OUT/scored"
if fresh "$OUT/scored/stats.json" $CONFIG "$OUT/lm" pipeline/*.py; then
  echo "up to date, skipped"
else
  $PY -m pipeline run --config $CONFIG --output "$OUT/scored" --set perplexity.models="$OUT/lm" --overwrite
fi

step "3/4 cutoffs -> $OUT/lm/cutoff.csv"
if fresh "$OUT/lm/cutoff.csv" "$OUT/scored/stats.json"; then
  echo "up to date, skipped"
else
  $PY -m pipeline cutoffs --corpus "$OUT/scored" --out "$OUT/lm/cutoff.csv"
fi

step "4/4 corpus with head/middle/tail buckets -> $OUT/corpus"
if fresh "$OUT/corpus/stats.json" $CONFIG "$OUT/lm/cutoff.csv" pipeline/*.py; then
  echo "up to date, skipped"
else
  $PY -m pipeline run --config $CONFIG --output "$OUT/corpus" --set perplexity.models="$OUT/lm" \
      --set perplexity.cutoffs="$OUT/lm/cutoff.csv" --overwrite
fi

echo
echo "demo done:"
echo "  language models   $OUT/lm/<lang>.sp.model, <lang>.arpa.bin, cutoff.csv"
echo "  corpus shards     $OUT/corpus/lang=<lang>/bucket=<head|middle|tail>/part-NNNNN.arrow"
echo "  statistics        $OUT/corpus/stats.json"
echo "  sampling weights  $OUT/corpus/sampling.json"
echo "  rejected records  $OUT/corpus/rejected/"
