# memory-gateway: installs exactly as the README does, runs `memory-gateway serve`.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY config ./config

# The README's install command (the venv keeps the image's system Python clean).
RUN python3 -m venv .venv && .venv/bin/pip install --no-cache-dir .

# Embedded Redis keeps its AOF here: mount a volume to keep memory across containers.
ENV PATH="/app/.venv/bin:$PATH" \
    MEMORY_GATEWAY_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8080

# Listen on all interfaces inside the container; the YAML default is loopback.
CMD ["memory-gateway", "serve", "--config", "config/gateway.yaml", "--host", "0.0.0.0", "--port", "8080"]
