# esp-mcp-gateway: the gateway as one container for a home server (see docs/deploy.md).
#
#   docker build -t esp-mcp-gateway .
#   docker run -d -p 8765:8765 -p 8766:8766 -p 1883:1883 -v gateway-data:/data \
#       -e GATEWAY_HOST_TOKEN=... -e GATEWAY_DEVICE_URL=http://<server LAN IP>:8765 esp-mcp-gateway
#
# BASE_IMAGE is any Debian-like image with python3 (3.11+) and its venv module: the official
# python:*-slim images, or a local base (deploy/test-image.sh builds one with debootstrap, where
# the interpreter is Debian's python3 in /usr/bin). Nothing below assumes which.
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
# A venv rather than the base's site-packages: the same path in both base kinds, pip is allowed
# to install into it (Debian marks its python3 externally managed), and copying it to the final
# stage leaves pip's caches and the build dependencies behind.
RUN python3 -m venv /opt/esp-mcp-gateway
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Dependencies first, from pyproject.toml alone: source changes then rebuild one small layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; \
        project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
        print("\n".join(project["dependencies"]))' > requirements.txt \
    && /opt/esp-mcp-gateway/bin/pip install --requirement requirements.txt
# The rest of what .dockerignore lets in: README.md, gateway/, device_fw/ (the firmware ships
# with the package: `simulate` runs it, `flash` copies it to boards).
COPY . ./
# pip (and setuptools, in a 3.11 venv) leave the venv afterwards: the running image needs neither.
RUN /opt/esp-mcp-gateway/bin/pip install --no-deps . \
    && /opt/esp-mcp-gateway/bin/pip uninstall --yes --quiet setuptools pip

FROM ${BASE_IMAGE}
# A fixed uid/gid so that a bind-mounted data dir can be chowned to it (docs/deploy.md).
ARG UID=10001
RUN groupadd --gid "${UID}" gateway \
    && useradd --no-log-init --uid "${UID}" --gid gateway --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin gateway \
    && mkdir -p /data /config \
    && chown gateway:gateway /data \
    && chmod 0700 /data
COPY --from=build /opt/esp-mcp-gateway /opt/esp-mcp-gateway
COPY deploy/healthcheck.py /opt/esp-mcp-gateway/healthcheck.py

# The contract names of DESIGN.md. Both listeners on every interface: inside a container,
# loopback would be unreachable through the published ports. The host listener off loopback
# refuses to start without GATEWAY_HOST_TOKEN, which only the deployment can supply.
# Environment beats the config file, so change these with -e, not in a mounted file.
# GATEWAY_CONFIG stays unset: set it to /config/gateway.toml when you mount one there.
ENV PATH=/opt/esp-mcp-gateway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GATEWAY_DATA_DIR=/data \
    GATEWAY_DEVICE_LISTEN=0.0.0.0:8765 \
    GATEWAY_HOST_LISTEN=0.0.0.0:8766 \
    GATEWAY_MQTT_LISTEN=0.0.0.0:1883

VOLUME /data
# 8765 devices (WebSocket, OTA), 8766 MCP hosts (/mcp, /sse; host token), 1883 embedded MQTT.
EXPOSE 8765 8766 1883
# Numeric, so that runtimes can tell it is not root without reading /etc/passwd (Kubernetes
# runAsNonRoot).
USER ${UID}:${UID}
WORKDIR /data

# The image's own python asks both listeners' /healthz, at the addresses the config names.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["/opt/esp-mcp-gateway/bin/python", "/opt/esp-mcp-gateway/healthcheck.py"]

ENTRYPOINT ["esp-mcp-gateway"]
CMD ["serve"]
