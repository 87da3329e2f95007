# The `trace serve` image: every registered TRACE env id over OpenEnv's HTTP/WebSocket API on port 8000.
#
# Built without a registry by `trace serve --build-image` (trace_envs/adapters/serve_image.py): it is FROM the
# project's own Debian base image (trace_envs/swe/images.py; python3.11 from debootstrap), and the Python
# dependencies are installed on the host into deps/ (`pip install --target`), because containers are offline.
# With a registry, `--from-registry python:3.11-slim` builds the base from that image instead.
ARG BASE_IMAGE=trace-swe-base:latest
FROM ${BASE_IMAGE}

COPY deps /opt/trace/serve-deps
COPY src /opt/trace/src
ENV PYTHONPATH=/opt/trace/src:/opt/trace/serve-deps \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    TRACE_CACHE=/tmp/trace-cache \
    TRACE_SERVE_MAX_SESSIONS=64 \
    TRACE_SERVE_IDLE_TIMEOUT_S=600
# Workspaces of generated envs: mount them and set TRACE_REGISTRY=/workspace (read at start).
WORKDIR /opt/trace/src
EXPOSE 8000
USER 65534:65534
# /health is OpenEnv's; with a token set, the check sends it too (every request must carry it).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD python3 -c "import os, urllib.request as u; t = os.environ.get('TRACE_SERVE_TOKEN'); r = u.Request('http://127.0.0.1:8000/health', headers={'Authorization': 'Bearer ' + t} if t else {}); u.urlopen(r, timeout=4)"
# 0.0.0.0 inside the container: publish the port on the host's 127.0.0.1, or set TRACE_SERVE_TOKEN.
CMD ["python3", "-m", "uvicorn", "trace_envs.adapters.openenv_server:app", "--host", "0.0.0.0", "--port", "8000"]
