# syntax=docker/dockerfile:1
# Build stage: install the package and its pinned dependencies into a venv.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY webhook ./webhook
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt . \
    && /opt/venv/bin/python -m compileall -q /opt/venv

# Final stage: the same Python, the venv, no build tools, a non-root user.
FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="gpushare-webhook" \
      org.opencontainers.image.description="Admission webhook that makes GPU sharing safe" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# 65532: the conventional "nonroot" uid; no shell account is needed.
USER 65532:65532
EXPOSE 8443
# Probes come from Kubernetes (readinessProbe /readyz, livenessProbe /healthz),
# which does not run a HEALTHCHECK.
# checkov:skip=CKV_DOCKER_2: Kubernetes probes /readyz and /healthz instead
ENTRYPOINT ["gpushare-webhook", "serve"]
CMD ["--policy=/etc/gpushare/policy/policy.yaml", "--cert=/etc/gpushare/tls/tls.crt", "--key=/etc/gpushare/tls/tls.key", "--bind=0.0.0.0:8443", "--watch-nodes"]
