# Engine rank image: CUDA runtime, torch (cu130 wheel) and `kvfleet[engine]`, every package pinned
# (docker/constraints.txt). Build arg FLASH_ATTN=1 (default) adds flash-attn's CuTe kernels from
# docker/flash-attn.txt (exact pins, --no-deps); FLASH_ATTN=0 leaves them out and the engine's
# `attention_backend: auto` then picks sdpa.
#   docker build -f docker/engine.Dockerfile [--build-arg FLASH_ATTN=0] -t kvfleet/engine .
# BASE_IMAGE and TORCH_INDEX_URL default to CUDA 13 and torch's cu130 wheels. Another CUDA (or a
# CPU image) changes both together, keeping an Ubuntu 24.04 base (apt's python3.12) and torch
# 2.13.0 (the constraints pin it; the index picks the build). PYTHON names the apt package of the
# interpreter (python3.12 on Ubuntu 24.04; python3.11 on a Debian bookworm base, as
# docker/build-images.sh builds its CPU variant with a local torch index). On CPU, for example
# (pin the base image's exact tag or digest for a release):
#   docker build -f docker/engine.Dockerfile --build-arg BASE_IMAGE=ubuntu:24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#     --build-arg FLASH_ATTN=0 -t kvfleet/engine-cpu .
# Without a Docker daemon, docker/build-images.sh builds the CPU variant with buildah.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}
ARG FLASH_ATTN=1
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG PYTHON=python3.12
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends "$PYTHON" "$PYTHON-venv" \
    && rm -rf /var/lib/apt/lists/* && "$PYTHON" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml setup.py /src/
COPY docker/constraints.txt docker/flash-attn.txt /src/docker/
# The dependencies first (torch alone is GBs), in a layer that only the files above decide (the
# project is installed from empty package folders and README, then removed): a change of kvfleet's code
# rebuilds the layers below only.
RUN pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0 \
    && mkdir -p /src/kvstore /src/services /src/operator /src/proto && touch /src/README.md \
    && pip install -c /src/docker/constraints.txt "/src[engine]" && pip uninstall -y kvfleet \
    && if [ "$FLASH_ATTN" = 1 ]; then pip install --no-deps -r /src/docker/flash-attn.txt; fi
COPY README.md /src/
COPY kvstore /src/kvstore
COPY services /src/services
COPY operator /src/operator
COPY proto /src/proto
# The generated gRPC code is part of the source (proto/*_pb2*.py): nothing is generated at run time.
RUN pip install --no-deps -c /src/docker/constraints.txt "/src[engine]"
RUN useradd --uid 10001 --create-home kvfleet && mkdir -p /var/lib/kvfleet/disk \
    && chown 10001:10001 /var/lib/kvfleet/disk
USER 10001
# Pods run with a read-only root: /tmp and /dev/shm are emptyDir volumes, so JIT caches go there.
ENV XDG_CACHE_HOME=/tmp/kvfleet-cache
ENTRYPOINT []
CMD ["kvfleet", "engine", "--help"]
