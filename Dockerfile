FROM tensorflow/tensorflow:2.21.0-gpu

ARG NSYS_VERSION=2025.3.1.90
ARG DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ADD --chmod=644 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu1804/x86_64/7fa2af80.pub /usr/share/keyrings/nvidia-devtools.asc

RUN source /etc/os-release \
    && echo "deb [signed-by=/usr/share/keyrings/nvidia-devtools.asc] https://developer.download.nvidia.com/devtools/repos/ubuntu${VERSION_ID//./}/$(dpkg --print-architecture)/ /" \
        > /etc/apt/sources.list.d/nvidia-devtools.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends "nsight-systems-cli=${NSYS_VERSION}*" \
    && rm -rf /var/lib/apt/lists/* \
    && nsys --version

WORKDIR /opt/detprof
COPY pyproject.toml README.md ./
COPY detprof ./detprof
RUN python3 -m pip install --no-cache-dir . \
    && useradd --create-home --uid 10001 detprof \
    && mkdir -p /work \
    && chown 10001:10001 /work

USER 10001
WORKDIR /work
ENTRYPOINT ["detprof"]
CMD ["--help"]
