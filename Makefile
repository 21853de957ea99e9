# The two set-up commands are `make demo` and `make test`; everything else is what they call.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
# A CUDA build of torch on a GPU host: `make install TORCH_VARIANT=cu130` takes the wheel from PyTorch's cu130
# index (TORCH_INDEX_URL names any other index). Unset: the default index's wheel (the CPU one here).
TORCH_VARIANT ?=
TORCH_INDEX_URL ?= $(if $(TORCH_VARIANT),https://download.pytorch.org/whl/$(TORCH_VARIANT),)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BUF    := node_modules/.bin/buf
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: install test demo demo-broker stubs ts-stubs lint-proto check-contract bench-broker clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build on CPU machines.
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
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

## TypeScript stubs (buf.gen.yaml, the local protoc-gen-es) into clients/typescript/gen.
ts-stubs: $(BUF)
	$(BUF) generate

## The committed TypeScript stubs are what the protos generate and they type-check; and the protos make no
## breaking change against the main branch (buf breaking, FILE rules).
check-contract: $(BUF)
	@tmp=$$(mktemp -d) && $(BUF) generate -o $$tmp && diff -r $$tmp/clients/typescript/gen clients/typescript/gen \
	  && rm -rf $$tmp || { echo "clients/typescript/gen is stale: run make ts-stubs"; exit 1; }
	node_modules/.bin/tsc -p clients/typescript
	@if git rev-parse -q --verify refs/heads/main >/dev/null; then $(BUF) breaking --against '.git#branch=main'; \
	  else echo "buf breaking not run: this clone has no main branch to compare with"; fi

test: $(STAMP) lint-proto check-contract
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
