# CUDA *devel* base: Triton compiles its launcher with a C compiler and the Python headers at run time
# (the runtime base has neither); python3-dev brings Python.h.
FROM nvidia/cuda:12.8.0-devel-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip python3-dev \
        gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# constraints.txt pins the tested versions; its torch==X.Y.Z (no local label) is PyPI's CUDA build on this image.
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -c constraints.txt -e .
ENV PATH=/venv/bin:$PATH GPUYANTRA_STATE_DIR=/state PYTHONUNBUFFERED=1
# The image runs the server (`gpuyantra serve ... --port 8000`) or a worker; this checks the server's
# liveness route. docker-compose.yml gives the workers their own check (Temporal reachable).
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD python3 -c "import os, sys, urllib.request; port = os.environ.get('GPUYANTRA_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"
