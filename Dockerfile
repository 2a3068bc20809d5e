FROM nvidia/cuda:12.8.0-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# The pins of pyproject.toml; on this image PyPI's torch==2.13.0 is its CUDA build, which is wanted here.
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -e .
ENV PATH=/venv/bin:$PATH GPUYANTRA_STATE_DIR=/state
