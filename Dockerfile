# mcp-backfill as a sidecar: `mcp-backfill serve` in front of an MCP server reached over HTTP.
# Configured entirely by environment variables (every option has an MCP_BACKFILL_* twin); see
# docs/container.md. Build: docker build -t mcp-backfill .
ARG PYTHON_VERSION=3.11

# Build stage: a virtualenv with the package and its runtime dependencies, nothing else; the extras
# redis (a ledger shared by replicas) and otel (traces, only when OTEL_* variables ask for them).
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN python -m venv /opt/mcp-backfill \
    && /opt/mcp-backfill/bin/pip install --no-cache-dir ".[redis,otel]" \
    && find /opt/mcp-backfill -name __pycache__ -prune -exec rm -rf {} +

# Runtime stage: the slim base, the virtualenv and the weather example (the upstream of compose.yaml).
FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 mcp \
    && useradd --system --uid 10001 --gid mcp --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin mcp
COPY --from=build /opt/mcp-backfill /opt/mcp-backfill
COPY examples/weather_server.py examples/weather_http.py /app/examples/
WORKDIR /app

# HOST 0.0.0.0: inside a container the port is only reachable through what the operator publishes.
# Binding every interface still makes `serve` refuse to start until MCP_BACKFILL_AUTH_TOKEN is set
# (or MCP_BACKFILL_ALLOW_UNAUTHENTICATED, a deliberate choice): the image ships no credential and
# no way around that rule, so a forgotten token fails closed instead of exposing the Claude key.
ENV PATH=/opt/mcp-backfill/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MCP_BACKFILL_HOST=0.0.0.0 \
    MCP_BACKFILL_PORT=8080 \
    MCP_BACKFILL_LOG_FORMAT=json

USER 10001:10001
EXPOSE 8080

# Only what the image has: the standard library's urllib. Non-2xx or no answer -> exit 1 -> unhealthy.
# Never through an HTTP_PROXY the container's egress may use: a proxy cannot reach our loopback.
# /healthz is Host-checked too: it sends the first name of MCP_BACKFILL_ALLOWED_HOSTS when that is
# set (the list replaces the loopback names), `name:*` with the port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; p = os.environ.get('MCP_BACKFILL_PORT', '8080'); h = [n.strip() for n in os.environ.get('MCP_BACKFILL_ALLOWED_HOSTS', '').split(',') if n.strip() not in ('', '*')] or ['127.0.0.1:' + p]; h = h[0][:-1] + p if h[0].endswith(':*') else h[0]; u.build_opener(u.ProxyHandler({})).open(u.Request('http://127.0.0.1:' + p + '/healthz', headers={'Host': h}), timeout=4)"]

ENTRYPOINT ["mcp-backfill"]
CMD ["serve"]
