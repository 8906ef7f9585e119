# syntax=docker/dockerfile:1
#
# Container image for the `worker` framework.
#
#   docker build -t worker:local .
#   docker run --rm worker:local                         # role from WORKER_ROLE (default: all)
#   docker run --rm -e WORKER_ROLE=leader worker:local
#   docker run --rm worker:local run --role consumer     # args override the env var
#
# Both stages use the same base image so the venv's interpreter symlink
# (/opt/venv/bin/python -> /usr/local/bin/python3.12) stays valid after the copy.
#
# Pin the base image by digest: a tag moves with every rebuild upstream, a digest does not.
#   digest=$(docker buildx imagetools inspect python:3.12-slim-bookworm \
#              --format '{{json .Manifest.Digest}}' | tr -d '"')
#   docker build --build-arg PYTHON_DIGEST="$digest" -t worker:1.2.3 .
# Release pipelines must pass it; without it the build uses the tag (a local build).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG PYTHON_DIGEST=

# --------------------------------------------------------------------------
# builder: install the project and its runtime deps into a self-contained venv
# --------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH="/opt/venv/bin:${PATH}"

RUN python -m venv /opt/venv

WORKDIR /src
# The build context is filtered by .dockerignore (no .git, tests, deploy, caches).
COPY . .
# Non-editable install of the local project (hatchling) with the `embedded` extra, every
# dependency at the exact version constraints.txt names (the build backend too: PIP_CONSTRAINT
# reaches pip's isolated build environment, where `-c` does not). Ranges live in pyproject.toml.
# DL3013 ("pin versions in pip") is a false positive here: the argument is the local source
# tree from the build context, and its dependencies are pinned by the constraints file.
# hadolint ignore=DL3013
RUN PIP_CONSTRAINT=/src/constraints.txt pip install --no-cache-dir -c constraints.txt ".[embedded]"

# --------------------------------------------------------------------------
# runtime: slim base + the venv, running as an unprivileged user
# --------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST} AS runtime

# A container has its own network namespace: probes from outside (kubelet, docker) reach the
# health server only on all interfaces. Outside a container the default stays 127.0.0.1.
# The port is set explicitly: a configured port is strict (taken: exit 2, one line), where the
# unconfigured default moves to a free port so two local workers do not clash.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH="/opt/venv/bin:${PATH}" \
    WORKER_HEALTH_HOST=0.0.0.0 \
    WORKER_HEALTH_PORT=8080

RUN groupadd --system --gid 10001 worker \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /app --shell /usr/sbin/nologin worker

COPY --from=builder /opt/venv /opt/venv

WORKDIR /app
USER 10001:10001

# Health / readiness / metrics HTTP server (WORKER_HEALTH_PORT, 0 disables it).
EXPOSE 8080

# The worker drains on SIGTERM; its worst case with the defaults is 51 s for a leader (drain
# delay, singletons' stop grace, lease release, shutdown timeout, margins; see
# Settings.worst_case_shutdown_s). Give it more: `docker stop -t 60`, compose
# `stop_grace_period: 60s`, k8s `terminationGracePeriodSeconds: 60`.
STOPSIGNAL SIGTERM

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "worker", "health"]

ENTRYPOINT ["python", "-m", "worker"]
CMD ["run"]
