"""What a worker is told about the GPU, how many stability workers share one, and how running out of memory reads.

Decisions only: no GPU is needed. Devices come from ``choose_device`` over the fake NVML,
the pool is a stand-in that records what its workers would be started with, and the
out-of-memory error is TensorFlow's own, raised where training would raise it.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fake_nvml import GIB, FakeNvml, a100, t4

from detprof.errors import UsageError
from detprof.profiler.devices import DeviceChoice, GpuInfo, choose_device
from detprof.profiler.gpu_env import gpu_env
from detprof.profiler.process import WorkerEnvironment
from detprof.stability import study, training, worker
from detprof.stability.variants import parse_variants, plan_runs

GROWTH = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
"""What a worker sharing its GPU is told: grow its memory (TensorFlow) and do not preallocate (JAX)."""
A100_UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
T4_UUID = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def two_gpus() -> FakeNvml:
    return FakeNvml([a100(), t4()])


@pytest.mark.parametrize("shares_gpu", [False, True])
def test_cpu_label_hides_every_gpu_and_asks_nothing_else(shares_gpu: bool) -> None:
    device = choose_device("cpu", nvml=two_gpus(), environ={})
    assert gpu_env(device, shares_gpu=shares_gpu) == {"CUDA_VISIBLE_DEVICES": ""}
    assert device.as_record()["cuda_visible_devices"] == ""


@pytest.mark.parametrize("shares_gpu", [False, True])
def test_without_a_gpu_the_environment_is_left_alone(shares_gpu: bool) -> None:
    assert gpu_env(choose_device(None, nvml=FakeNvml([]), environ={}), shares_gpu=shares_gpu) == {}
    forced = choose_device("t4", force=True, nvml=FakeNvml([]), environ={})
    assert gpu_env(forced, shares_gpu=shares_gpu) == {}
    assert forced.as_record()["cuda_visible_devices"] is None


def test_a_chosen_gpu_is_pinned_by_uuid() -> None:
    device = choose_device("t4", nvml=two_gpus(), environ={}, gpu_index="1")
    assert gpu_env(device, shares_gpu=False) == {"CUDA_VISIBLE_DEVICES": T4_UUID}
    assert device.as_record()["cuda_visible_devices"] == T4_UUID


def test_jax_workers_on_a_cpu_allocate_from_one_arena_and_record_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX's CPU threads' arenas page-faulted fresh buffers step after step (``ONE_ARENA_ENV``): a JAX worker on a CPU
    gets one arena; TensorFlow's, PyTorch's and a GPU's workers do not; a user's own value wins; records keep it."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    cpu = choose_device("cpu", nvml=two_gpus(), environ={})
    gpu = choose_device("t4", nvml=two_gpus(), environ={}, gpu_index="1")
    jax_cpu = WorkerEnvironment(cpu, backend="jax")
    assert jax_cpu.detprof_env()["MALLOC_ARENA_MAX"] == "1" and jax_cpu.timing_env()["MALLOC_ARENA_MAX"] == "1"
    for other in (
        WorkerEnvironment(cpu, backend="tensorflow"),
        WorkerEnvironment(cpu),
        WorkerEnvironment(gpu, backend="jax"),
    ):
        assert "MALLOC_ARENA_MAX" not in other.detprof_env() and "MALLOC_ARENA_MAX" not in other.timing_env()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert jax_cpu.timing_env()["MALLOC_ARENA_MAX"] == "4"


def test_workers_sharing_a_gpu_grow_their_memory() -> None:
    """Stability's parallel workers, and ``verify``'s replicas run side by side on one GPU (``WorkerEnvironment``)."""
    device = choose_device(None, nvml=two_gpus(), environ={})
    assert gpu_env(device, shares_gpu=True) == {"CUDA_VISIBLE_DEVICES": A100_UUID} | GROWTH
    assert GROWTH.items() <= WorkerEnvironment(device, shares_gpu=True).detprof_env().items()
    assert not GROWTH.keys() & WorkerEnvironment(device).detprof_env().keys()


def test_without_a_uuid_the_nvml_index_is_pinned_in_pci_order() -> None:
    device = DeviceChoice(label="t4", gpu=GpuInfo(index=1, name="Tesla T4"))
    assert gpu_env(device, shares_gpu=False) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert (
        gpu_env(device, shares_gpu=True)
        == {
            "CUDA_VISIBLE_DEVICES": "1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        | GROWTH
    )


def test_the_users_mig_instance_is_kept_not_replaced_by_a_whole_gpu() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "MIG-1234"}
    device = choose_device(None, nvml=two_gpus(), environ=environ)
    assert gpu_env(device, shares_gpu=True) == {"CUDA_VISIBLE_DEVICES": "MIG-1234"} | GROWTH
    with pytest.raises(UsageError, match="cannot choose among MIG instances"):
        choose_device(None, nvml=two_gpus(), environ=environ, gpu_index="1")


def on_gpu(free_bytes: int) -> tuple[DeviceChoice, FakeNvml]:
    gpu = a100()
    gpu.free_bytes = free_bytes
    nvml = FakeNvml([gpu])
    return choose_device(None, nvml=nvml, environ={}), nvml


def test_one_job_by_default_on_a_gpu_and_up_to_four_on_the_cpu() -> None:
    assert study.default_jobs(on_gpu(80 * GIB)[0]) == 1
    cpu = study.default_jobs(choose_device("cpu", nvml=two_gpus(), environ={}))
    assert cpu == study.default_jobs() == study.default_jobs(None)
    assert 1 <= cpu <= 4


def test_workers_training_on_the_cpu_at_once_share_its_cores_out_within_the_users_own_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(study, "usable_cpus", lambda: 8)
    cpu = choose_device("cpu", nvml=two_gpus(), environ={})
    assert [study.cpu_threads(cpu, jobs, {}) for jobs in (1, 2, 3, 4, 16)] == [None, 4, 2, 2, 1]
    assert study.cpu_threads(cpu, 2, {"OMP_NUM_THREADS": "1"}) == 1
    assert study.cpu_threads(cpu, 2, {"OMP_NUM_THREADS": "6,2"}) == 4
    assert study.cpu_threads(cpu, 2, {"OMP_NUM_THREADS": "many"}) == 4
    assert study.cpu_threads(on_gpu(80 * GIB)[0], 2, {}) is None


@pytest.mark.parametrize(
    ("free_gib", "fit"), [(0.5, 1), (1.9, 1), (2, 1), (3.9, 1), (4, 2), (7.5, 3), (8, 4), (80, 40)]
)
def test_gpu_jobs_that_fit_one_per_two_gib_free(free_gib: float, fit: int) -> None:
    assert study.gpu_jobs_that_fit(int(free_gib * GIB)) == fit


def test_jobs_beyond_free_memory_are_refused_saying_how_many_fit() -> None:
    study.refuse_jobs_over_memory(4, 8 * GIB)
    study.refuse_jobs_over_memory(1, 0)
    study.refuse_jobs_over_memory(16, None)  # NVML could not tell: nothing to check against
    with pytest.raises(UsageError) as err:
        study.refuse_jobs_over_memory(4, 5 * GIB)
    assert str(err.value) == (
        "--jobs 4 does not fit on the GPU: 5.0 GiB free and each worker needs 2.0 GiB, so at most 2 fit; pass --jobs 2"
    )
    with pytest.raises(UsageError, match=r"at most 1 fits; pass --jobs 1$"):
        study.refuse_jobs_over_memory(2, GIB)


def test_check_jobs_reads_free_memory_on_a_gpu_only() -> None:
    device, nvml = on_gpu(3 * GIB)
    study.check_jobs(1, device, nvml)
    with pytest.raises(UsageError, match=r"^--jobs 2 does not fit on the GPU: 3\.0 GiB free"):
        study.check_jobs(2, device, nvml)
    device, nvml = on_gpu(79 * GIB)
    study.check_jobs(4, device, nvml)
    cpu = choose_device("cpu", nvml=nvml, environ={})
    study.check_jobs(64, cpu, FakeNvml(init_error=1))
    with pytest.raises(UsageError, match=r"^--jobs must be at least 1 \(got 0\)$"):
        study.check_jobs(0, device, nvml)


class RecordingPool:
    """A process pool that starts nothing: it records what its workers would be initialized with."""

    started: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, *, initargs: tuple[Any, ...], **_: Any) -> None:
        self.started.append(initargs)

    def submit(self, _fn: Any, run: Any, _config: Any) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        future.set_result({"run_id": run.run_id})
        return future

    def shutdown(self, **_: Any) -> None:
        pass


@pytest.mark.parametrize(("jobs", "shared"), [(1, False), (2, True), (4, True)])
def test_stability_workers_start_with_the_gpu_environment(monkeypatch, tmp_path: Path, jobs: int, shared: bool) -> None:
    monkeypatch.setattr(study, "ProcessPoolExecutor", RecordingPool)
    monkeypatch.setattr(RecordingPool, "started", [])
    runs = plan_runs(parse_variants("algo,control"), 2)
    config = training.TrainConfig("smallcnn", "digits", 1, 128, 4e-4, False, str(tmp_path))
    records: list[dict[str, Any]] = []
    device = choose_device("t4", nvml=two_gpus(), environ={}, gpu_index="GPU-bbbb")
    study.execute_runs(runs, config, jobs, records.append, device=device)
    assert sorted(r["run_id"] for r in records) == sorted(r.run_id for r in runs)
    expected = {"CUDA_VISIBLE_DEVICES": T4_UUID} | (GROWTH if shared else {})
    assert RecordingPool.started and all(args[2] == expected for args in RecordingPool.started)


def execute_raising(monkeypatch, tmp_path: Path, error: Exception) -> dict[str, Any]:
    def train(*_: object) -> dict[str, Any]:
        raise error

    monkeypatch.setattr(training, "train", train)
    run = plan_runs(parse_variants("algo"), 2)[0]
    config = training.TrainConfig("smallcnn", "digits", 1, 128, 4e-4, False, str(tmp_path))
    return dict(worker.execute(run, config))


def test_tensorflow_out_of_memory_is_recorded_as_such(monkeypatch, tmp_path: Path) -> None:
    import tensorflow as tf

    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[128,32,8,8]")
    record = execute_raising(monkeypatch, tmp_path, error)
    assert record["status"] == "failed"
    assert record["reason"] == (
        "out of memory: ResourceExhaustedError: OOM when allocating tensor with shape[128,32,8,8]"
    )


def test_host_out_of_memory_is_recorded_as_such(monkeypatch, tmp_path: Path) -> None:
    record = execute_raising(monkeypatch, tmp_path, MemoryError())
    assert (record["status"], record["reason"]) == ("failed", "out of memory: MemoryError")


def test_other_failures_are_not_called_out_of_memory(monkeypatch, tmp_path: Path) -> None:
    record = execute_raising(monkeypatch, tmp_path, ValueError("bad shape"))
    assert (record["status"], record["reason"]) == ("failed", "ValueError: bad shape")
