# One image for the services: python -m gpu_broker | inference_service | inference_router | training_service.
#   docker build -t diffusion-services .                                   # CUDA 13.0 torch
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 -t diffusion-services .
# It installs exactly what pyproject.toml declares (tests/test_deploy.py checks this file says so), with torch
# first from the chosen index, as the Makefile does.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/var/cache/huggingface

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /opt/diffusion-services
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
COPY pyproject.toml README.md ./
COPY diffusion ./diffusion
COPY diffusion_client ./diffusion_client
COPY diffusion_kit ./diffusion_kit
COPY gpu_broker ./gpu_broker
COPY inference_router ./inference_router
COPY inference_service ./inference_service
COPY service_kit ./service_kit
COPY training_service ./training_service
RUN pip install .

RUN useradd --system --uid 10001 --home-dir /var/lib/diffusion diffusion \
    && mkdir -p /var/lib/diffusion /var/cache/huggingface /var/cache/diffusion/compile \
    && chown diffusion /var/lib/diffusion /var/cache/huggingface /var/cache/diffusion /var/cache/diffusion/compile
USER 10001
EXPOSE 50051 50052 50053 9100
ENTRYPOINT ["python", "-m"]
CMD ["inference_service", "--listen", "0.0.0.0:50052"]
