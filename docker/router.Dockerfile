# Router image: `kvfleet router` on `kvfleet[router]` (no torch), every package pinned
# (docker/constraints.txt); site-packages is never written at run time.
#   docker build -f docker/router.Dockerfile -t kvfleet/router .
# NOTE: no Docker daemon runs where kvfleet is developed and tested, so no image is built here or
# in CI; bench/readonly_install_check.sh does this install on a read-only site-packages as a
# non-root user and runs `kvfleet router --help` (docs/deploy.md).
# The exact interpreter the test suite runs on (a floating 3.11-slim tag would change under a
# rebuild); bump it deliberately.
FROM python:3.11.7-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml setup.py README.md /src/
COPY docker/constraints.txt /src/docker/
COPY kvstore /src/kvstore
COPY services /src/services
COPY operator /src/operator
COPY proto /src/proto
RUN pip install -c /src/docker/constraints.txt "/src[router]"
RUN useradd --uid 10001 --no-create-home kvfleet
USER 10001
CMD ["kvfleet", "router", "--help"]
