"""The GPU part of every worker's environment, decided in one place for every launcher.

Three facts make it necessary. NVML, which detprof asks which GPU there is and whose label
it checks, numbers GPUs in PCI bus order, while CUDA by default numbers them fastest first:
on a machine with two models "GPU 0" is two different cards, and the label check and the
telemetry would watch one card while the worker trains on the other. TensorFlow opens every
GPU it can see, so an unpinned worker holds memory on cards it never uses, which other
jobs (or our own parallel workers) need. And on the GPU it uses TensorFlow reserves nearly
all the memory at start (JAX three quarters of it), so a second process sharing that GPU
runs out of memory unless every one of them grows its allocation as it goes."""

from __future__ import annotations

from detprof.profiler.devices import DeviceChoice


def gpu_env(device: DeviceChoice, *, shares_gpu: bool) -> dict[str, str]:
    """The variables to set in a worker's environment (before TensorFlow loads) for ``device``.

    - label ``cpu`` with GPUs present: ``CUDA_VISIBLE_DEVICES=""``, so the CPU is what is measured;
    - a GPU chosen: ``CUDA_VISIBLE_DEVICES`` names it alone (``device.cuda_visible_devices``),
      by UUID, which means one card in any enumeration order. Where NVML gave no UUID it is
      the NVML index, and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number GPUs the way NVML
      does, so that index is still the card checked;
    - no GPU at all: nothing, the environment stays as the user left it.

    ``shares_gpu`` (several workers run on the GPU at once) adds ``TF_FORCE_GPU_ALLOW_GROWTH=true``
    and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (JAX takes 75% of the memory at start otherwise):
    each worker then takes memory as it needs it. PyTorch's caching allocator grows by itself.
    """
    pinned = device.cuda_visible_devices
    if pinned is None:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": pinned}
    if device.gpu is None:
        return env
    if device.gpu.uuid is None and device.mig_devices is None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if shares_gpu:
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env
