# The two set-up commands are `make demo` and `make test`; everything else is what they call.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BUF    := node_modules/.bin/buf
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: install test demo demo-broker stubs lint-proto bench-broker clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build on CPU machines.
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(BUF): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(STAMP)

## Regenerate diffusion/v1/*_pb2*.py from proto/ (the only way stubs are made).
stubs: $(STAMP)
	$(BIN)/python -m tools.gen_stubs

## buf lint with the STANDARD rules, and buf's canonical formatting.
lint-proto: $(BUF)
	$(BUF) lint
	$(BUF) format --diff --exit-code

test: $(STAMP) lint-proto
	$(BIN)/python -m pytest -n 2 --dist loadfile

## The main job, on a model built locally: broker, inference and training on loopback; an image, a LoRA
## trained on images the model made, and an image with that LoRA, all over gRPC through diffusion_client.
demo: $(STAMP)
	$(BIN)/python -m demos.generate_demo

## Two clients contending for one device: grant, preempt, release, regrant.
demo-broker: $(STAMP)
	$(BIN)/python -m demos.broker_contention

## Broker latency benchmark; appends JSON lines to docs/bench/broker.jsonl.
bench-broker: $(STAMP)
	$(BIN)/python -m benchmarks.broker_bench --out docs/bench/broker.jsonl

clean:
	rm -rf $(VENV) node_modules .pytest_cache demo-output
