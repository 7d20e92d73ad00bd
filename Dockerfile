# The goodput image the Helm chart runs: sidecar, forecaster and the bundled engine.
#   docker build -t ghcr.io/goodput/goodput:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/home/goodput

# torch first, exactly this version from the CPU index: a loose pin pulls a multi-GB CUDA build.
# (A GPU image would take the matching CUDA wheel instead.)
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY goodput_cli ./goodput_cli
COPY engine ./engine
COPY sidecar ./sidecar
COPY forecaster ./forecaster
COPY dashboards ./dashboards
COPY tracefiles ./tracefiles
# A C compiler for the install only: it builds the sidecar's fast path for streamed tokens
# (sidecar/_fastrelay.c), which the slim image would otherwise skip, running the Python path.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install . \
    && python -c "import goodput_cli.main; from sidecar.upstream import FAST_PATH; assert FAST_PATH, 'C fast path not built'" \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/*

# Non-root, matching the chart's runAsUser/runAsGroup 10001. The root filesystem is read-only in
# the chart; model caches go to emptyDirs mounted under $HOME/.cache and /tmp.
RUN groupadd --gid 10001 goodput && useradd --uid 10001 --gid 10001 --home-dir /home/goodput --create-home goodput
USER 10001:10001

EXPOSE 8080 8000 9090 8443
ENTRYPOINT ["goodput"]
CMD ["--help"]
