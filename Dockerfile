# The image every node of a detprof fleet runs (docs/fleet.md, "The node image"), and the one to run a
# sweep on a single GPU machine: TensorFlow's GPU image, nsys, Ray, and detprof.
FROM tensorflow/tensorflow:2.21.0-gpu

# The Nsight Systems CLI to install, as `nsys --version` reports it without its build suffix.
# The build fails unless NVIDIA's devtools repository has it and the installed nsys reports it.
ARG NSYS_VERSION=2025.3.1.90
ARG DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NVIDIA's devtools repository for the image's own Ubuntu release and architecture, signed by
# the key published in that same repository (nvidia.pub), as NVIDIA's own images add it; not the
# CUDA repositories' 2018 key 7fa2af80, which NVIDIA rotated out in 2022. python3 fetches the key
# because a TensorFlow image is sure to have it (NVIDIA's CUDA base images remove the curl they
# install). rsync is what Ray's cluster launcher copies files into a node's container with; it
# comes with the Ubuntu release the base image pins (hence no version of its own, DL3008).
# hadolint ignore=DL3008
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
    && apt-get install -y --no-install-recommends rsync "nsight-systems-cli=${NSYS_VERSION}*" \
    && rm -rf /var/lib/apt/lists/* \
    && if ! nsys --version | grep -qxE "NVIDIA Nsight Systems version ${NSYS_VERSION}(-.*)?"; then \
        echo "NSYS_VERSION=${NSYS_VERSION}, but the installed nsys reports: $(nsys --version 2>&1)" >&2; \
        exit 1; \
    fi

# detprof with TensorFlow (the embedded default's framework) and its Ray extra: the same image is a fleet's head node and each of its GPU nodes.
# The versions are pyproject.toml's (DL3013 asks to pin a package by name; this is the local project).
WORKDIR /opt/detprof
COPY pyproject.toml README.md ./
COPY detprof ./detprof
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir ".[tensorflow,ray]" \
    && useradd --create-home --uid 10001 detprof \
    && mkdir -p /work \
    && chown 10001:10001 /work

USER 10001
WORKDIR /work

# Cheap and measurement-free, so it can run beside a sweep: NVML still sees this node's GPU, nsys
# still answers, the frameworks are installed. The smoke runs, which use the GPU, are the fleet's
# `detprof doctor` before it schedules work on a node (docs/fleet.md).
HEALTHCHECK --interval=5m --timeout=2m --start-period=1m --retries=2 CMD ["detprof", "doctor", "--no-smoke"]

# No ENTRYPOINT: Ray's cluster launcher starts a node's container as `docker run ... IMAGE bash`
# and runs its commands with `docker exec`; run detprof as `docker run --gpus all IMAGE detprof ...`.
CMD ["detprof", "--help"]
