# The two commands: `make demo` and `make test`. Both set everything up first (workflows/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= out/demo
FORCE ?= 0

.PHONY: setup demo test test-slow bench sdist sample clean

setup:
	@bash workflows/setup.sh

demo: setup
	PY=$(PY) DEMO_OUT=$(DEMO_OUT) FORCE=$(FORCE) bash workflows/demo.sh

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

bench: setup
	$(PY) workflows/bench_pipeline.py
	$(PY) workflows/bench_floor.py
	$(PY) workflows/bench_engines.py
	$(PY) workflows/bench_scaling.py
	$(PY) workflows/bench_shuffle.py --per-file
	$(PY) workflows/capacity.py --out docs/capacity.md
	$(PY) workflows/bench_perplexity.py
	$(PY) workflows/bench_neardup.py
	$(PY) workflows/bench_quality.py
	$(PY) workflows/bench_tokenize.py
	$(PY) workflows/bench_loader.py
	$(PY) workflows/bench_models.py --configs xlmr-tiny,mdeberta-tiny --seq 128,512 --batch 8
	$(PY) workflows/bench_models.py --configs xlmr-base --seq 128,512 --batch 4 --iters 3
	$(PY) workflows/bench_trainer.py
	$(PY) workflows/bench_gpu.py
	$(PY) workflows/bench_xeval.py

sdist: setup
	$(PY) -m build --sdist --no-isolation -o dist .

sample: setup
	$(PY) workflows/make_sample.py

clean:
	rm -rf out dist build *.egg-info
