# cfmaps service image.
#   podman build --pull=never --format docker -t cfmaps .    (or: docker build -t cfmaps .)
#   podman run -p 8000:8000 -e CFMAPS_ADMIN_TOKEN=... -v cfmaps-data:/data cfmaps
# It also runs as any UID in group 0 (--user 12345:0) and with a read-only root file system
# (--read-only --tmpfs /tmp).
# ("--format docker" keeps the HEALTHCHECK, which podman's default OCI format drops.)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# tini as PID 1: it forwards signals to `cfmaps serve` and reaps the processes re-parented to
# it (a worker's forkserver and build processes, when the worker dies), which would otherwise
# stay zombies: uvicorn's supervisor, as PID 1, never waits for processes it did not start.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, read from pyproject.toml alone (core + the "service" extra): this layer
# is rebuilt only when pyproject.toml changes, not on every source edit.
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import subprocess, sys, tomllib; \
p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
deps = p['dependencies'] + p['optional-dependencies']['service']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *deps])"

# The project itself (what .dockerignore lets through), without touching the dependencies.
COPY . ./
RUN python -m pip install --no-deps . \
    && cd / && rm -rf /src

# Compile the engine's numba kernels once, at build time, into a cache the service user owns:
# otherwise the first build and query in every new container spend about a minute in the JIT.
# warm_up() is what a service runs before it reports ready (builds with and without mixed
# regions, memory-mapped maps, single queries and batches, with a time budget): here it fills
# the cache, so a container's own warm-up only loads it.
ENV NUMBA_CACHE_DIR=/var/cache/cfmaps/numba
RUN mkdir -p "$NUMBA_CACHE_DIR" \
    && python -c "from maps_core.warmup import warm_up; print(f'kernels compiled in {warm_up():.0f} s')"

# An unprivileged user owns the data directory, the JIT cache and its home; everything else
# stays root-owned. Group 0 gets the owner's rights on them (the OpenShift convention): a
# container run as any UID in group 0 (OpenShift, Kubernetes runAsUser) uses them as they
# are. Run as another group, or with a read-only root file system, the engine copies the
# prebuilt JIT cache to a private folder under /tmp at start (maps_core/_jitcache.py).
RUN useradd --system --uid 10001 --gid 0 --create-home --home-dir /home/cfmaps cfmaps \
    && mkdir -p /data \
    && chown -R cfmaps:0 /data /var/cache/cfmaps /home/cfmaps \
    && chmod -R g=u /data /var/cache/cfmaps /home/cfmaps

# Two query processes by default (they share the memory-mapped maps through the page
# cache); CFMAPS_ROLE=api|builder splits building from serving (docker-compose.yml).
ENV CFMAPS_DATA_DIR=/data \
    CFMAPS_WORKERS=2
VOLUME ["/data"]
WORKDIR /home/cfmaps
USER cfmaps
EXPOSE 8000

# No curl in the slim image: probe /readyz with Python (urlopen raises on a non-2xx answer).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4); sys.exit(0)"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["cfmaps", "serve", "--host", "0.0.0.0", "--port", "8000"]
