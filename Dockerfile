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

# The shim: HAMi-core's libvgpu.so, built from its source at a pinned commit (its
# repository carries no licence file: see docs/node-agent.md). The source and CMake come
# through Python, pinned (the commit names the source's bytes; pip pins CMake);
# the library is built on NVIDIA's CUDA devel image, as HAMi-core's own build does.
FROM python:3.11.11-slim-bookworm AS shim-source
ARG HAMI_CORE_COMMIT=8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN pip install --no-cache-dir --target=/opt/cmake-wheel cmake==3.31.6 \
    && python -c "import sys, tarfile, urllib.request; \
url = 'https://github.com/Project-HAMi/HAMi-core/archive/' + sys.argv[1] + '.tar.gz'; \
tarfile.open(urllib.request.urlretrieve(url)[0]).extractall('/src', filter='data')" \
        "${HAMI_CORE_COMMIT}" \
    && mv "/src/HAMi-core-${HAMI_CORE_COMMIT}" /src/hami-core

FROM nvidia/cuda:13.3.0-devel-ubi8 AS shim
COPY --from=shim-source /opt/cmake-wheel/cmake/data /opt/cmake
COPY --from=shim-source /src/hami-core /src/hami-core
WORKDIR /src/hami-core
RUN CMAKE=/opt/cmake/bin/cmake bash ./build.sh \
    && test -f build/libvgpu.so

# Final stage: the same Python, the venv, the shim, no build tools, a non-root user.
FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="gpushare-webhook" \
      org.opencontainers.image.description="Admission webhook that makes GPU sharing safe" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# The node agent (gpushare-webhook node agent) installs it on every GPU node.
COPY --from=shim /src/hami-core/build/libvgpu.so /opt/gpushare/shim/libvgpu.so
# 65532: the conventional "nonroot" uid; no shell account is needed.
USER 65532:65532
EXPOSE 8443
# Probes come from Kubernetes (readinessProbe /readyz, livenessProbe /healthz),
# which does not run a HEALTHCHECK.
# checkov:skip=CKV_DOCKER_2: Kubernetes probes /readyz and /healthz instead
ENTRYPOINT ["gpushare-webhook", "serve"]
CMD ["--policy=/etc/gpushare/policy/policy.yaml", "--cert=/etc/gpushare/tls/tls.crt", "--key=/etc/gpushare/tls/tls.key", "--bind=0.0.0.0:8443", "--watch-nodes"]
