#!/usr/bin/env bash
# The end-to-end demo on the bundled sample (run by `make demo` after set-up), WET files to an
# XNLI-format transfer report:
#   1. train a SentencePiece + KenLM model per language from the sample's reference text
#   2. run the corpus pipeline with perplexity scoring (no cutoffs yet)
#   3. compute CCNet-layout cutoff.csv from the perplexity distribution
#   4. run the pipeline again with head/middle/tail buckets -> corpus shards, stats, sampling weights
#   5. train a SentencePiece unigram tokenizer on alpha-sampled corpus text
#   6. write token shards
#   7. pretrain a tiny XLM-R (MODEL=mdeberta: a tiny mDeBERTa-v3 with RTD) with DeepSpeed on CPU
#   8. export it in HF transformers format
#   9. fine-tune / select / test it on the bundled NLI smoke set, three seeds -> report
# A step is skipped when it finished before with the same inputs: its stamp (a hash of its command,
# its config files, the code it runs and the outputs of the steps it reads) is unchanged. Editing a
# config or the code of a stage redoes that step; the steps after it are redone only if its output
# changed (the stages write byte-identical outputs for the same inputs). A step that was interrupted
# with the same stamp continues where it stopped (token shards already written are kept, training
# resumes from its last checkpoint). FORCE=1 redoes all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-out/demo}
FORCE=${FORCE:-0}
MODEL=${MODEL:-xlmr}
CORPUS_CONFIG=configs/corpus/sample.yaml
case "$MODEL" in
  xlmr) TRAIN_CONFIG=configs/pretrain/tiny-cpu.yaml ;;
  mdeberta) TRAIN_CONFIG=configs/pretrain/tiny-cpu-mdeberta.yaml ;;
  *) echo "error: MODEL must be xlmr or mdeberta, got '$MODEL'" >&2; exit 2 ;;
esac
RUN="$OUT/run-$MODEL"
STAMPS="$OUT/.stamps"
mkdir -p "$STAMPS"
START=$SECONDS

# step NAME "INPUT FILES/DIRS (their contents are hashed)" COMMAND...
step() {
  local name=$1 inputs=$2; shift 2
  echo; echo "== $name  [$((SECONDS - START)) s]"
  local stamp
  stamp=$( { printf '%s\n' "$*"; declare -f "$1" || true; find $inputs -type f -not -name '*.pyc' -print0 2>/dev/null | sort -z \
             | xargs -0 sha1sum; } | sha1sum | cut -c1-16)
  if [[ "$FORCE" != 1 && -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$stamp" ]]; then
    echo "up to date (same command, inputs and code), skipped"
    return
  fi
  rm -f "$STAMPS/$name"
  RESUME=0
  if [[ "$FORCE" != 1 && -f "$STAMPS/$name.started" && "$(cat "$STAMPS/$name.started")" == "$stamp" ]]; then
    RESUME=1
    echo "continuing an interrupted run of this step"
  fi
  echo "$stamp" > "$STAMPS/$name.started"
  "$@"
  echo "$stamp" > "$STAMPS/$name"
  rm -f "$STAMPS/$name.started"
}

fresh_dir() {  # fresh_dir DIR: empty DIR unless the step is continuing an interrupted run
  [[ "$RESUME" == 1 ]] || rm -rf "$1"
}

step lm "configs/lm tests/data/sample/ref pipeline/steps/lm.py pipeline/steps/normalize.py" \
  $PY -m pipeline train-lm --config configs/lm/sample.yaml --out "$OUT/lm" --overwrite

step scored "$CORPUS_CONFIG tests/data/sample/wet pipeline $OUT/lm" \
  $PY -m pipeline run --config $CORPUS_CONFIG --output "$OUT/scored" --set perplexity.models="$OUT/lm" --overwrite

step cutoffs "pipeline/steps/perplexity.py $OUT/scored/lang=*" \
  $PY -m pipeline cutoffs --corpus "$OUT/scored" --out "$OUT/cutoff.csv"

step corpus "$CORPUS_CONFIG tests/data/sample/wet pipeline $OUT/lm $OUT/cutoff.csv" \
  $PY -m pipeline run --config $CORPUS_CONFIG --output "$OUT/corpus" --set perplexity.models="$OUT/lm" \
      --set perplexity.cutoffs="$OUT/cutoff.csv" --overwrite

tokenizer() {
  rm -rf "$OUT/tokenizer"
  $PY -m pretrain tokenizer --corpus "$OUT/corpus" --vocab-size 8000 --sample-size 100000 --out "$OUT/tokenizer"
}
step tokenizer "pretrain/tokenizer.py $OUT/corpus/lang=* $OUT/corpus/sampling.json" tokenizer

tokens() {
  fresh_dir "$OUT/tokens"
  $PY -m pretrain tokenize --corpus "$OUT/corpus" --tokenizer "$OUT/tokenizer" --out "$OUT/tokens"
}
step tokens "pretrain/shards.py pretrain/tokenizer.py $OUT/tokenizer $OUT/corpus/lang=*" tokens

pretrain() {
  fresh_dir "$RUN"
  local resume=()
  [[ -f "$RUN/checkpoints/latest" ]] && resume=(--resume)
  $PY -m pretrain train --config $TRAIN_CONFIG --set tokens="$OUT/tokens" --set tokenizer="$OUT/tokenizer" \
      --set export_hf=false --output "$RUN" "${resume[@]}"
}
step "pretrain-$MODEL" "$TRAIN_CONFIG configs/models configs/deepspeed pretrain $OUT/tokens $OUT/tokenizer" pretrain

export_hf() {
  rm -rf "$OUT/hf-$MODEL"
  $PY -m pretrain export --checkpoint "$RUN" --out "$OUT/hf-$MODEL"
}
step "export-$MODEL" "pretrain/export.py pretrain/models $STAMPS/pretrain-$MODEL" export_hf

xnli() {
  rm -rf "$OUT/report-$MODEL"
  $PY -m xeval xnli --config configs/xnli/smoke.yaml --model "$OUT/hf-$MODEL" --data tests/data/nli-smoke \
      --out "$OUT/report-$MODEL"
}
step "xnli-$MODEL" "configs/xnli/smoke.yaml tests/data/nli-smoke xeval $STAMPS/export-$MODEL" xnli

screenshots() {  # what a reader sees, for CI artifacts (Debian's chromium, when installed)
  local browser; browser=$(command -v chromium || command -v chromium-browser || true)
  [[ -n "$browser" ]] || { echo "no chromium: no screenshots of the reports"; return; }
  mkdir -p "$OUT/screenshots"
  local profile; profile=$(mktemp -d)  # Chromium's own profile folder, removed after the shots
  for page in "$OUT/corpus/report/report.html" "$OUT/report-$MODEL/report.html"; do
    local name; name=$(basename "$(dirname "$page")")
    [[ "$name" == report ]] && name=corpus-report
    "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
        --user-data-dir="$profile" --window-size=1280,2400 --screenshot="$OUT/screenshots/$name.png" \
        "file://$(realpath "$page")" >/dev/null 2>&1 || echo "chromium could not take a screenshot of $page"
  done
  rm -rf "$profile"
}
screenshots

echo
echo "demo done in $((SECONDS - START)) s:"
echo "  language models   $OUT/lm/<lang>.sp.model, <lang>.arpa.bin; cutoffs $OUT/cutoff.csv"
echo "  corpus shards     $OUT/corpus/lang=<lang>/bucket=<head|middle|tail>/part-NNNNN.arrow"
echo "  statistics        $OUT/corpus/stats.json"
echo "  sampling weights  $OUT/corpus/sampling.json"
echo "  removed documents $OUT/corpus/removed/<step>/ (each with its reason; rejected/ beside it holds records that could not be read, if any)"
echo "  scored corpus     $OUT/scored/ (the input of the cutoffs)"
echo "  corpus report     $OUT/corpus/report/report.html (report.md, *.png)"
echo "  tokenizer         $OUT/tokenizer/ (sentencepiece.bpe.model, spm.model, tokenizer_meta.json)"
echo "  token shards      $OUT/tokens/ (meta.json, lang=<lang>/bucket=<b>/part-N/)"
echo "  pretraining run   $RUN/ (checkpoints/, metrics.jsonl, tensorboard/)"
echo "  HF export         $OUT/hf-$MODEL/"
echo "  XNLI-format report $OUT/report-$MODEL/ (report.html, report.md, results.json, *.png)"
echo "  screenshots       $OUT/screenshots/ (both reports as a browser shows them)"
