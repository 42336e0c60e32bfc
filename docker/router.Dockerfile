# Router image: the `kvfleet router` command, CPU only (torch CPU wheel). Not built in CI here.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md /src/
COPY kvstore /src/kvstore
COPY services /src/services
COPY operator /src/operator
COPY proto /src/proto
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install /src && python -m kvfleet.proto
RUN useradd --uid 10001 --no-create-home kvfleet
USER 10001
CMD ["kvfleet", "router", "--help"]
