# Router image: `kvfleet router` on `kvfleet[router]` (no torch), every package pinned
# (docker/constraints.txt); site-packages is never written at run time.
#   docker build -f docker/router.Dockerfile -t kvfleet/router .
# The exact interpreter the test suite runs on (a floating 3.11-slim tag would change under a
# rebuild); bump it deliberately.
FROM python:3.11.7-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml setup.py /src/
COPY docker/constraints.txt /src/docker/
# The dependencies first, in a layer that only the files above decide (the project is installed
# from empty package folders and README, then removed): a change of kvfleet's code rebuilds the layers below.
RUN mkdir -p /src/kvstore /src/services /src/operator /src/proto && touch /src/README.md \
    && pip install -c /src/docker/constraints.txt "/src[router]" && pip uninstall -y kvfleet
COPY README.md /src/
COPY kvstore /src/kvstore
COPY services /src/services
COPY operator /src/operator
COPY proto /src/proto
RUN pip install --no-deps -c /src/docker/constraints.txt "/src[router]"
RUN useradd --uid 10001 --no-create-home kvfleet
USER 10001
CMD ["kvfleet", "router", "--help"]
