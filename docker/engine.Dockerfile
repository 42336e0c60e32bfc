# Engine rank image: CUDA runtime, torch, and flash-attn's CuTe kernels (flash-attn-4, pure
# Python over the CuTe DSL; the 2.x sdist takes hours to compile). Not built in CI here.
FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/* && python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md /src/
COPY kvstore /src/kvstore
COPY services /src/services
COPY operator /src/operator
COPY proto /src/proto
RUN pip install --index-url https://download.pytorch.org/whl/cu130 torch==2.13.0 \
    && pip install /src flash-attn-4 && python -m kvfleet.proto
RUN useradd --uid 10001 --create-home kvfleet && mkdir -p /var/lib/kvfleet/disk \
    && chown 10001:10001 /var/lib/kvfleet/disk
USER 10001
# Pods run with a read-only root: /tmp and /dev/shm are emptyDir volumes.
ENTRYPOINT []
CMD ["kvfleet", "engine", "--help"]
