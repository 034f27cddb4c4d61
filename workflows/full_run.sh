#!/usr/bin/env bash
# The whole chain at scale, each step skipped when its output is complete and resumable when not:
#
#   1. corpus      CommonCrawl snapshot -> corpus on gs:// (Dataflow, workflows/dataflow.sh)  marker: $CORPUS_GS/stats.json
#   2. download    corpus -> $WORK/corpus (gsutil rsync: resumable)                           marker: $WORK/corpus/stats.json
#   3. tokenizer   SentencePiece unigram on alpha-sampled text (one big CPU machine)          marker: $SHARED/tokenizer/tokenizer_meta.json
#   4. tokenize    token shards (a rerun skips the shards already written)                    marker: $SHARED/tokens/meta.json
#   5. pretrain    DeepSpeed on the nodes of $HOSTFILE (workflows/train_multinode.sh), or on the
#                  local GPUs without a hostfile; --resume when a `latest` checkpoint exists  marker: `latest` names step-$STEPS
#   6. export      HF transformers directory                                                   marker: $HF/model.safetensors
#   7. xnli        zero-shot XNLI on the official XNLI-1.0 + XNLI-MT-1.0 files                 marker: $REPORT/results.json
#
# Usage (run steps 3-7 on the node that starts training; steps 1-2 anywhere with gsutil):
#   PROJECT=my-project BUCKET=my-bucket HOSTFILE=hosts XNLI_DIR=/data/xnli SHARED=/shared/polyglot \
#     workflows/full_run.sh [STEP...]
#   STEP: corpus download tokenizer tokenize pretrain export xnli (default: all, in that order)
#
# Environment (defaults in brackets):
#   PROJECT, BUCKET, REGION, SNAPSHOT, CCNET_LM_DIR, MIRROR, MACHINE_TYPE, MAX_WORKERS, ...
#                  passed to workflows/dataflow.sh (see its header) for step 1
#   SNAPSHOT       CommonCrawl snapshot [CC-MAIN-2024-10]
#   CORPUS_GS      corpus written by step 1 [gs://$BUCKET/corpus/$SNAPSHOT]
#   WORK           local disk for the downloaded corpus [out/full]
#   SHARED         folder every training node sees at the same path (NFS, Lustre, ...): tokenizer,
#                  tokens, run [$WORK]
#   BUCKETS        corpus buckets used for the tokenizer and the token shards, as sampling.buckets in
#                  the corpus config [head middle all]
#   VOCAB_SIZE     tokenizer vocabulary [250002]
#   SAMPLE_SIZE    tokenizer training sentences [2000000]
#   TRAIN_CONFIG   run config [configs/pretrain/xlmr-base.yaml]; configs/pretrain/mdeberta-v3-base.yaml for mDeBERTa-v3
#   RUN            run name [basename of TRAIN_CONFIG without .yaml]; run dir $SHARED/runs/$RUN
#   STEPS          optimizer steps [the config's `steps`]
#   HOSTFILE       DeepSpeed hostfile ("host slots=8" per line, workflows/hostfile.example);
#                  unset: one node, $GPUS local GPUs
#   GPUS           local GPUs without a hostfile [8]
#   TRAIN_FLAGS    more `pretrain train` options, e.g. "--set loader.batch_size=16"
#   HF             exported model [$SHARED/runs/$RUN/hf-export]
#   XNLI_DIR       folder holding XNLI-1.0/ and XNLI-MT-1.0/ (the official zips, unpacked) [required for step 7]
#   XNLI_CONFIG    [configs/xnli/xtreme.yaml]
#   XNLI_GPUS      GPUs for the evaluation on this node (>1: under the DeepSpeed launcher) [1]
#   REPORT         [$SHARED/reports/$RUN]
#   PY             [.venv/bin/python]; DEEPSPEED [.venv/bin/deepspeed]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DEEPSPEED=${DEEPSPEED:-.venv/bin/deepspeed}
GSUTIL=${GSUTIL:-gsutil}
SNAPSHOT=${SNAPSHOT:-CC-MAIN-2024-10}
export SNAPSHOT
CORPUS_GS=${CORPUS_GS:-gs://${BUCKET:-YOUR_BUCKET}/corpus/$SNAPSHOT}
WORK=${WORK:-out/full}
SHARED=${SHARED:-$WORK}
read -r -a BUCKET_LIST <<< "${BUCKETS:-head middle all}"
VOCAB_SIZE=${VOCAB_SIZE:-250002}
SAMPLE_SIZE=${SAMPLE_SIZE:-2000000}
TRAIN_CONFIG=${TRAIN_CONFIG:-configs/pretrain/xlmr-base.yaml}
RUN=${RUN:-$(basename "$TRAIN_CONFIG" .yaml)}
RUN_DIR="$SHARED/runs/$RUN"
if [[ -z "${STEPS:-}" ]]; then  # the training config's own number of steps
  [[ -f "$TRAIN_CONFIG" ]] || { echo "error: TRAIN_CONFIG=$TRAIN_CONFIG: no such file" >&2; exit 2; }
  STEPS=$("$PY" -c 'import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
if not isinstance(config, dict) or "steps" not in config:
    sys.exit(f"error: TRAIN_CONFIG={sys.argv[1]}: no steps key (set it there, or STEPS here)")
print(config["steps"])' "$TRAIN_CONFIG") || exit 2
fi
GPUS=${GPUS:-8}
HF=${HF:-$RUN_DIR/hf-export}
XNLI_CONFIG=${XNLI_CONFIG:-configs/xnli/xtreme.yaml}
XNLI_GPUS=${XNLI_GPUS:-1}
REPORT=${REPORT:-$SHARED/reports/$RUN}
TOKENIZER="$SHARED/tokenizer"
TOKENS="$SHARED/tokens"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

say() { echo; echo "== $*  [$(date -u +%H:%M:%S) UTC]"; }
done_() { echo "   done already ($1), skipped"; }

step_corpus() {
  say "1/7 corpus on Dataflow -> $CORPUS_GS"
  if "$GSUTIL" -q stat "$CORPUS_GS/stats.json" 2>/dev/null; then done_ "$CORPUS_GS/stats.json"; return; fi
  OUTPUT="$CORPUS_GS" bash workflows/dataflow.sh
}

step_download() {
  say "2/7 corpus -> $WORK/corpus"
  if [[ -f "$WORK/corpus/stats.json" ]]; then done_ "$WORK/corpus/stats.json"; return; fi
  mkdir -p "$WORK/corpus"
  # stats.json last, so that its presence means the copy is complete
  "$GSUTIL" -m rsync -r -x '^stats\.json$' "$CORPUS_GS" "$WORK/corpus"
  "$GSUTIL" cp "$CORPUS_GS/stats.json" "$WORK/corpus/stats.json"
}

step_tokenizer() {
  say "3/7 tokenizer -> $TOKENIZER"
  if [[ -f "$TOKENIZER/tokenizer_meta.json" ]]; then done_ "$TOKENIZER/tokenizer_meta.json"; return; fi
  rm -rf "$TOKENIZER.tmp"
  "$PY" -m pretrain tokenizer --corpus "$WORK/corpus" --buckets "${BUCKET_LIST[@]}" \
    --vocab-size "$VOCAB_SIZE" --sample-size "$SAMPLE_SIZE" --out "$TOKENIZER.tmp"
  rm -rf "$TOKENIZER"
  mv "$TOKENIZER.tmp" "$TOKENIZER"
}

step_tokenize() {
  say "4/7 token shards -> $TOKENS"
  if [[ -f "$TOKENS/meta.json" ]]; then done_ "$TOKENS/meta.json"; return; fi
  # resumable: shards already written with this tokenizer are skipped
  "$PY" -m pretrain tokenize --corpus "$WORK/corpus" --tokenizer "$TOKENIZER" --buckets "${BUCKET_LIST[@]}" \
    --out "$TOKENS" --no-progress
}

step_pretrain() {
  say "5/7 pretraining $TRAIN_CONFIG ($STEPS steps) -> $RUN_DIR"
  local latest="$RUN_DIR/checkpoints/latest"
  if [[ -f "$latest" && "$(cat "$latest")" == "step-$STEPS" ]]; then done_ "$latest names step-$STEPS"; return; fi
  local args=(--set "tokens=$TOKENS" --set "tokenizer=$TOKENIZER" --set export_hf=false
              --output "$RUN_DIR" --steps "$STEPS")
  if [[ -f "$latest" ]]; then
    echo "   resuming from $(cat "$latest")"
    args+=(--resume)
  fi
  # shellcheck disable=SC2206
  args+=(${TRAIN_FLAGS:-})
  if [[ -n "${HOSTFILE:-}" ]]; then
    bash workflows/train_multinode.sh "$HOSTFILE" "$TRAIN_CONFIG" "${args[@]}"
  else
    "$DEEPSPEED" --num_nodes 1 --num_accelerators "$GPUS" --no_local_rank \
      --module pretrain train --config "$TRAIN_CONFIG" "${args[@]}"
  fi
}

step_export() {
  say "6/7 export -> $HF"
  if [[ -f "$HF/model.safetensors" && -f "$HF/config.json" ]]; then done_ "$HF/model.safetensors"; return; fi
  rm -rf "$HF.tmp"
  "$PY" -m pretrain export --checkpoint "$RUN_DIR" --tag "step-$STEPS" --out "$HF.tmp"
  rm -rf "$HF"
  mv "$HF.tmp" "$HF"
}

step_xnli() {
  say "7/7 zero-shot XNLI -> $REPORT"
  if [[ -f "$REPORT/results.json" ]]; then done_ "$REPORT/results.json"; return; fi
  : "${XNLI_DIR:?set XNLI_DIR to the folder holding XNLI-1.0/ and XNLI-MT-1.0/}"
  local args=(--config "$XNLI_CONFIG" --model "$HF" --data "$XNLI_DIR" --out "$REPORT")
  if (( XNLI_GPUS > 1 )); then
    "$DEEPSPEED" --num_gpus "$XNLI_GPUS" --no_local_rank --module xeval xnli "${args[@]}"
  else
    "$PY" -m xeval xnli "${args[@]}"
  fi
  echo "   report: $REPORT/report.html (compare runs: $PY -m xeval report $REPORT OTHER_REPORT --out reports/compare)"
}

STEPS_TO_RUN=("$@")
[[ ${#STEPS_TO_RUN[@]} -gt 0 ]] || STEPS_TO_RUN=(corpus download tokenizer tokenize pretrain export xnli)
for s in "${STEPS_TO_RUN[@]}"; do  # every name checked before the first step's hours
  case "$s" in
    corpus|download|tokenizer|tokenize|pretrain|export|xnli) ;;
    *) echo "error: unknown step '$s' (corpus download tokenizer tokenize pretrain export xnli)" >&2; exit 2 ;;
  esac
done
for s in "${STEPS_TO_RUN[@]}"; do
  "step_$s"
done
echo
echo "full run done: corpus $CORPUS_GS, tokens $TOKENS, run $RUN_DIR, model $HF, report $REPORT"
