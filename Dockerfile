FROM tensorflow/tensorflow:2.21.0-gpu

# The Nsight Systems CLI to install, as `nsys --version` reports it without its build suffix.
# The build fails unless NVIDIA's devtools repository has it and the installed nsys reports it.
ARG NSYS_VERSION=2025.3.1.90
ARG DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NVIDIA's devtools repository for the image's own Ubuntu release and architecture, signed by
# the key published in that same repository. python3 fetches the key because a TensorFlow
# image is sure to have it (NVIDIA's CUDA base images remove the curl they install).
RUN source /etc/os-release \
    && python3 -c "import sys, urllib.request; urllib.request.urlretrieve(*sys.argv[1:])" \
        "https://developer.download.nvidia.com/devtools/repos/ubuntu${VERSION_ID//./}/$(dpkg --print-architecture)/nvidia.pub" \
        /usr/share/keyrings/nvidia-devtools.asc \
    && echo "deb [signed-by=/usr/share/keyrings/nvidia-devtools.asc] https://developer.download.nvidia.com/devtools/repos/ubuntu${VERSION_ID//./}/$(dpkg --print-architecture)/ /" \
        > /etc/apt/sources.list.d/nvidia-devtools.list \
    && apt-get update \
    && if ! apt-cache madison nsight-systems-cli | grep -qF "| ${NSYS_VERSION}"; then \
        echo "NSYS_VERSION=${NSYS_VERSION}: NVIDIA's devtools repository has no such nsight-systems-cli; it has:" \
            "$(apt-cache madison nsight-systems-cli | cut -d'|' -f2 | xargs)" >&2; \
        exit 1; \
    fi \
    && apt-get install -y --no-install-recommends "nsight-systems-cli=${NSYS_VERSION}*" \
    && rm -rf /var/lib/apt/lists/* \
    && if ! nsys --version | grep -qxE "NVIDIA Nsight Systems version ${NSYS_VERSION}(-.*)?"; then \
        echo "NSYS_VERSION=${NSYS_VERSION}, but the installed nsys reports: $(nsys --version 2>&1)" >&2; \
        exit 1; \
    fi

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
