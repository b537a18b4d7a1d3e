"""GPU discovery, labels and ``detprof gpus``, with NVML faked at its boundary only."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
from fake_nvml import GIB, FakeNvml, a100, t4
from piped_cli import table_rows

from detprof.cli import main
from detprof.errors import UsageError
from detprof.gpu_labels import GENERATIONS, KNOWN_GPUS, generation
from detprof.profiler import devices as gpu_mod
from detprof.profiler.devices import (
    DeviceChoice,
    GpuInfo,
    check_label,
    choose_device,
    label_matches,
    list_gpus,
    probe_gpus,
    visible_gpus,
)
from detprof.profiler.tracers import refuse_nvprof

A100_UUID = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
T4_UUID = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
RECORD_KEYS = {
    "label",
    "name",
    "uuid",
    "driver",
    "cuda_driver",
    "compute_capability",
    "sm_count",
    "memory_bytes",
}


def info(name: str, index: int = 0, cc: str | None = "8.0", uuid: str | None = None) -> GpuInfo:
    return GpuInfo(index=index, name=name, uuid=uuid, compute_capability=cc)


def test_no_gpus_after_a_successful_init() -> None:
    nvml = FakeNvml([])
    probe = probe_gpus(nvml)
    assert probe.gpus == []
    assert probe.problems == ["the driver is loaded but reports 0 devices"]
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_one_gpu_is_read_completely() -> None:
    nvml = FakeNvml([a100()])
    assert list_gpus(nvml) == [
        GpuInfo(
            index=0,
            name="NVIDIA A100-SXM4-80GB",
            uuid=A100_UUID,
            compute_capability="8.0",
            sm_count=108,
            memory_bytes=80 * GIB,
            driver_version="550.54.15",
            cuda_driver_version="12.4",
        )
    ]
    assert nvml.shutdowns == 1


def test_two_gpus_and_queries_the_board_does_not_support() -> None:
    old = t4()
    old.cc = None
    gpus = list_gpus(FakeNvml([a100(), old]))
    assert [g.name for g in gpus] == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].sm_count is None and gpus[1].compute_capability is None
    assert gpus[1].memory_bytes == 15 * GIB and gpus[1].uuid == T4_UUID


def test_a_lost_gpu_is_reported_and_the_others_kept() -> None:
    probe = probe_gpus(FakeNvml([a100(), t4()], broken_handles=frozenset({0})))
    assert [g.name for g in probe.gpus] == ["Tesla T4"]
    assert probe.problems == ["GPU 0: GPU is lost"]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_missing_library_or_driver_means_no_gpu(code: int, reason: str) -> None:
    nvml = FakeNvml([a100()], init_error=code)
    probe = probe_gpus(nvml)
    assert probe.gpus == [] and probe.problems == [reason]
    assert nvml.shutdowns == 0


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("t4", "Tesla T4"),
        ("T4", "Tesla T4"),
        ("tesla-t4", "Tesla T4"),
        ("p100", "Tesla P100-PCIE-16GB"),
        ("v100", "Tesla V100-SXM2-16GB"),
        ("rtx5000", "Quadro RTX 5000"),
        ("rtx-5000", "Quadro RTX 5000"),
        ("a10g", "NVIDIA A10G"),
        ("l4", "NVIDIA L4"),
        ("a100", "NVIDIA A100-SXM4-80GB"),
        ("a100", "NVIDIA A100 80GB PCIe"),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB"),
        ("nvidia-a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB"),
        ("h100", "NVIDIA H100 80GB HBM3"),
        ("h100", "NVIDIA H100 PCIe"),
        ("h200", "NVIDIA H200"),
        ("a6000", "NVIDIA RTX A6000"),
        ("rtxa6000", "NVIDIA RTX A6000"),
        ("4090", "NVIDIA GeForce RTX 4090"),
        ("rtx4090", "NVIDIA GeForce RTX 4090"),
        ("3090ti", "NVIDIA GeForce RTX 3090 Ti"),
        ("rtx5000ada", "NVIDIA RTX 5000 Ada Generation"),
    ],
)
def test_label_matches(label: str, name: str) -> None:
    assert label_matches(label, name)


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("l4", "NVIDIA L40S"),
        ("l4", "NVIDIA L40"),
        ("a10", "NVIDIA A100-SXM4-40GB"),
        ("a10", "NVIDIA A10G"),
        ("h100", "NVIDIA H1000"),
        ("h200", "NVIDIA GH200 480GB"),
        ("t4", "NVIDIA T400"),
        ("v100", "Tesla P100-PCIE-16GB"),
        ("3090", "NVIDIA GeForce RTX 3090 Ti"),
        ("4090", "NVIDIA GeForce RTX 4090 D"),
        ("rtx5000", "NVIDIA RTX 5000 Ada Generation"),
        ("a100-40gb", "NVIDIA A100-SXM4-80GB"),
        ("80gb-a100", "NVIDIA A100-SXM4-80GB"),
        ("nvidia", "NVIDIA A100-SXM4-80GB"),
        ("cpu", "NVIDIA A100-SXM4-80GB"),
    ],
)
def test_label_does_not_match(label: str, name: str) -> None:
    assert not label_matches(label, name)


def test_mismatch_is_refused_in_one_line_unless_forced() -> None:
    gpus = [info("NVIDIA A100-SXM4-80GB")]
    with pytest.raises(UsageError) as err:
        check_label("t4", gpus, force=False)
    assert str(err.value) == (
        "--gpu t4 does not match the detected GPU 'NVIDIA A100-SXM4-80GB'; pass --force to label it anyway"
    )
    assert err.value.exit_code == 2
    forced = check_label("t4", gpus, force=True)
    assert forced == DeviceChoice(label="t4", gpu=gpus[0], hide_gpus=False, forced=True)
    assert forced.as_record()["forced"] is True


def test_matching_label_is_kept_lowercased() -> None:
    gpus = [info("Tesla T4", cc="7.5")]
    assert check_label("T4", gpus) == DeviceChoice(label="t4", gpu=gpus[0])


def test_label_without_a_gpu_is_refused_unless_forced() -> None:
    with pytest.raises(UsageError) as err:
        check_label("v100", [])
    assert str(err.value) == ("--gpu v100 was given but no NVIDIA GPU was detected; pass --force to label it anyway")
    assert check_label("v100", [], force=True) == DeviceChoice(label="v100", gpu=None, forced=True)


@pytest.mark.parametrize("label", ["t4/x", "", " ", "nvidia", "tesla-quadro"])
def test_unusable_labels_are_refused(label: str) -> None:
    with pytest.raises(UsageError, match="--gpu"):
        check_label(label, [], force=True)


def test_cpu_label_hides_a_present_gpu() -> None:
    choice = check_label("cpu", [info("NVIDIA A100-SXM4-80GB")])
    assert choice == DeviceChoice(label="cpu", gpu=None, hide_gpus=True)
    record = choice.as_record()
    assert set(record) >= RECORD_KEYS
    assert record["label"] == "cpu" and record["uuid"] is None and record["compute_capability"] is None
    assert record["cpu_count"] == len(os.sched_getaffinity(0))
    assert record["name"]
    assert check_label("cpu", []) == DeviceChoice(label="cpu", gpu=None, hide_gpus=False)


def test_without_a_label_the_first_gpu_names_the_results() -> None:
    gpus = [info("NVIDIA A100-SXM4-80GB"), info("Tesla T4", index=1)]
    assert check_label(None, gpus).label == "nvidia-a100-sxm4-80gb"
    assert check_label(None, []) == DeviceChoice(label="cpu", gpu=None)


X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz
stepping\t: 7

processor\t: 1
model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
CPU implementer\t: 0x41
CPU part\t: 0xd08

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


def fake_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str | None) -> None:
    """``/proc/cpuinfo`` as the device code opens it reads ``text`` (or does not exist, for None)."""
    fake = tmp_path / "cpuinfo"
    if text is not None:
        fake.write_text(text)
    monkeypatch.setattr(gpu_mod, "Path", lambda p: fake if str(p) == "/proc/cpuinfo" else Path(p))


@pytest.mark.parametrize(
    ("cpuinfo", "model"),
    [
        # "model : 85" is the family's model number, not its name.
        (X86_CPUINFO, "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"),
        (ARM_CPUINFO, "Raspberry Pi 4 Model B Rev 1.4"),
    ],
    ids=["x86", "arm"],
)
def test_cpu_record_names_the_cpu_model(monkeypatch, tmp_path, cpuinfo: str, model: str) -> None:
    fake_proc_cpuinfo(monkeypatch, tmp_path, cpuinfo)
    assert check_label(None, []).as_record()["name"] == model


def test_cpu_record_without_proc_cpuinfo_names_the_machine(monkeypatch, tmp_path) -> None:
    fake_proc_cpuinfo(monkeypatch, tmp_path, None)
    monkeypatch.setattr(gpu_mod.platform, "processor", lambda: "")
    monkeypatch.setattr(gpu_mod.platform, "machine", lambda: "aarch64")
    assert check_label(None, []).as_record()["name"] == "aarch64"


def test_gpu_record_carries_what_nvml_said() -> None:
    choice = choose_device("a100", nvml=FakeNvml([a100()]), environ={})
    assert choice.as_record() == {
        "label": "a100",
        "forced": False,
        "cuda_visible_devices": A100_UUID,
        "name": "NVIDIA A100-SXM4-80GB",
        "index": 0,
        "uuid": A100_UUID,
        "driver": "550.54.15",
        "cuda_driver": "12.4",
        "compute_capability": "8.0",
        "sm_count": 108,
        "memory_bytes": 80 * GIB,
    }


def test_visible_devices_decide_which_gpu_a_label_is_checked_against() -> None:
    gpus = [info("NVIDIA A100-SXM4-80GB", 0, uuid=A100_UUID), info("Tesla T4", 1, uuid=T4_UUID)]
    assert visible_gpus(gpus, {}) == gpus
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1"}) == [gpus[1]]
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,0"}) == [gpus[1], gpus[0]]
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "0,7,1"}) == [gpus[0]]
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-bbbbbbbb"}) == [gpus[1]]
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "MIG-1234"}) == gpus
    nvml = FakeNvml([a100(), t4()])
    assert choose_device("t4", nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "1"}).gpu.name == "Tesla T4"
    with pytest.raises(UsageError, match="does not match the detected GPU 'NVIDIA A100-SXM4-80GB'"):
        choose_device("t4", nvml=nvml, environ={})
    with pytest.raises(UsageError, match="no NVIDIA GPU was detected"):
        choose_device("t4", nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize(("cc", "name"), [("8.0", "NVIDIA A100-SXM4-80GB"), ("9.0", "NVIDIA H100 80GB HBM3")])
def test_nvprof_is_refused_from_ampere_on(cc: str, name: str) -> None:
    with pytest.raises(UsageError) as err:
        refuse_nvprof(info(name, cc=cc))
    assert str(err.value) == (
        f"nvprof does not support compute capability 8.0 and newer ({name} is {cc}); use --tracer nsys"
    )


@pytest.mark.parametrize("cc", ["7.0", "7.5", "6.0", None])
def test_nvprof_is_accepted_before_ampere(cc: str | None) -> None:
    refuse_nvprof(info("Tesla V100-SXM2-16GB", cc=cc))


def test_nvprof_without_a_gpu_is_refused() -> None:
    with pytest.raises(UsageError, match="needs an NVIDIA GPU"):
        refuse_nvprof(None)


def run_gpus_command(monkeypatch, capsys, nvml: FakeNvml | None, columns: str | None = "200") -> tuple[int, str, str]:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    if nvml is not None:
        monkeypatch.setattr(gpu_mod, "default_nvml", lambda: nvml)
    code = main(["gpus"])
    out, err = capsys.readouterr()
    return code, out, err


def test_gpus_command_lists_every_gpu(monkeypatch, capsys) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code, out, err = run_gpus_command(monkeypatch, capsys, FakeNvml([a100(), t4()]))
    assert (code, err) == (0, "")
    a100_row = next(line for line in out.splitlines() if "A100" in line)
    for cell in ("NVIDIA A100-SXM4-80GB", A100_UUID, "8.0", "108", "80.0 GiB", "550.54.15", "12.4"):
        assert cell in a100_row
    t4_row = next(line for line in out.splitlines() if "Tesla T4" in line)
    for cell in (T4_UUID, "7.5", "?", "15.0 GiB"):
        assert cell in t4_row
    assert "CUDA_VISIBLE_DEVICES" not in out


def test_gpus_command_off_a_terminal_is_one_line_per_gpu(monkeypatch, capsys) -> None:
    """``detprof gpus > gpus.txt``: each GPU's row whole on one line, not folded to 80 columns."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code, out, _ = run_gpus_command(monkeypatch, capsys, FakeNvml([a100(), t4()]), columns=None)
    assert code == 0
    rows = [row[:3] for row in table_rows(out)]
    assert rows == [["0", "NVIDIA A100-SXM4-80GB", A100_UUID], ["1", "Tesla T4", T4_UUID]]


def test_gpus_command_says_which_gpus_cuda_will_use(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    code, out, _ = run_gpus_command(monkeypatch, capsys, FakeNvml([a100(), t4()]))
    assert code == 0
    assert "CUDA_VISIBLE_DEVICES='1': CUDA sees 1 (Tesla T4); sweeps use the first" in out


def test_gpus_command_without_nvml(monkeypatch, capsys) -> None:
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    code, out, err = run_gpus_command(monkeypatch, capsys, nvml)
    assert (code, err) == (0, "")
    assert out.strip() == "No NVIDIA GPU found (NVML: NVML Shared Library Not Found)"


def test_gpus_command_with_the_real_nvml_and_no_driver_library(monkeypatch, capsys) -> None:
    """The real ``pynvml`` module, unpatched in detprof, on a machine whose libnvidia-ml.so cannot be loaded.

    Only the shared-library load below pynvml is made to fail, so the outcome is known on every
    machine, with or without a GPU, and pynvml's own error is what reaches the user.
    """

    def no_library(name: str, *args: object, **kwargs: object) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pynvml, "nvmlLib", None)  # forget a library an earlier test may have loaded
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    assert gpu_mod.default_nvml() is pynvml
    code, out, err = run_gpus_command(monkeypatch, capsys, None)
    assert (code, err) == (0, "")
    assert out.strip() == "No NVIDIA GPU found (NVML: NVML Shared Library Not Found)"


def test_unknown_label_is_refused_even_with_force() -> None:
    """A typo is not a device the user vouches for: ``--force`` never files results under it."""
    for gpus in ([], [info("NVIDIA A100-SXM4-80GB")]):
        for force in (False, True):
            with pytest.raises(UsageError) as err:
                check_label("V101", gpus, force=force)
            message = str(err.value)
            assert message.startswith("unknown GPU label 'v101' (known: t4, v100, a100, h100, ")
            assert message.endswith(", cpu)") and "\n" not in message
            assert err.value.exit_code == 2


@pytest.mark.parametrize("label", ["t4", "tesla-t4", "a100-80gb", "nvidia-a100-sxm4-80gb", "rtx-5000", "4090"])
def test_known_labels_in_their_longer_spellings(label: str) -> None:
    assert gpu_mod.known_label(label)
    assert check_label(label, [], force=True).forced


@pytest.mark.parametrize("label", ["v101", "a1000", "t40", "h100x", "rtx2070"])
def test_labels_that_name_no_known_board(label: str) -> None:
    assert not gpu_mod.known_label(label)


def test_a_board_missing_from_the_table_is_accepted_when_detected() -> None:
    """The table only catches typos; the detected GPU confirms a label it does not list."""
    gpus = [info("NVIDIA GeForce RTX 2070 SUPER", cc="7.5")]
    assert check_label("rtx2070super", gpus) == DeviceChoice(label="rtx2070super", gpu=gpus[0])
    with pytest.raises(UsageError, match="unknown GPU label 'rtx2070'"):
        check_label("rtx2070", gpus, force=True)


def test_every_known_label_names_its_own_boards() -> None:
    for label, names in KNOWN_GPUS.items():
        assert names and all(label_matches(label, name) for name in names), label


def test_every_known_board_has_one_architecture() -> None:
    assert sorted(label for labels in GENERATIONS.values() for label in labels) == sorted(KNOWN_GPUS)
    for label, names in KNOWN_GPUS.items():
        assert {generation(label), *map(generation, names)} == {
            next(name for name, labels in GENERATIONS.items() if label in labels)
        }, label
    assert generation("NVIDIA H200") == generation("nvidia-h100-80gb-hbm3") == "Hopper"
    assert generation("NVIDIA A10G") == "Ampere" and generation("NVIDIA L40S") == "Ada Lovelace"
    assert generation("NVIDIA GeForce RTX 2070 SUPER") is None


@pytest.mark.parametrize("command", ["sweep", "kernels"])
@pytest.mark.parametrize("nvml", [FakeNvml([]), FakeNvml([a100()])], ids=["no-gpu", "a100"])
@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "forced"])
def test_cli_refuses_an_unknown_label_before_anything_runs(
    monkeypatch, capsys, tmp_path: Path, command: str, nvml: FakeNvml, force: list[str]
) -> None:
    from detprof.profiler import process

    started: list[object] = []

    def no_worker(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise AssertionError("a worker was started")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_mod, "default_nvml", lambda: nvml)
    monkeypatch.setattr(process.subprocess, "Popen", no_worker)
    monkeypatch.setattr(process.subprocess, "run", no_worker)
    code = main([command, "--gpu", "v101", *force])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("detprof: error: unknown GPU label 'v101' (known: t4, v100, a100, ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert started == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("wanted", ["1", " 1 ", T4_UUID, "GPU-bbbb", "gpu-BBBBBBBB-1111"])
def test_gpu_index_picks_a_gpu_by_nvml_index_uuid_or_uuid_prefix(wanted: str) -> None:
    choice = choose_device(None, nvml=FakeNvml([a100(), t4()]), environ={}, gpu_index=wanted)
    assert (choice.label, choice.gpu.index, choice.gpu.uuid) == ("tesla-t4", 1, T4_UUID)
    assert choose_device("t4", nvml=FakeNvml([a100(), t4()]), environ={}, gpu_index=wanted).label == "t4"


def test_gpu_index_is_the_gpu_the_label_is_checked_against() -> None:
    nvml = FakeNvml([a100(), t4()])
    assert choose_device(None, nvml=nvml, environ={}).gpu.uuid == A100_UUID  # no --gpu-index: the first visible
    with pytest.raises(UsageError, match="does not match the detected GPU 'Tesla T4'"):
        choose_device("a100", nvml=nvml, environ={}, gpu_index="1")
    forced = choose_device("a100", force=True, nvml=nvml, environ={}, gpu_index="1")
    assert forced.forced and forced.gpu.uuid == T4_UUID


@pytest.mark.parametrize(
    ("wanted", "environ", "message"),
    [
        (
            "7",
            {},
            "--gpu-index 7 matches no GPU (GPUs: 0: NVIDIA A100-SXM4-80GB GPU-aaaaaaaa-1111-2222-3333-444444444444; "
            "1: Tesla T4 GPU-bbbbbbbb-1111-2222-3333-444444444444)",
        ),
        ("GPU-cccc", {}, "--gpu-index GPU-cccc matches no GPU (GPUs: 0: NVIDIA A100-SXM4-80GB "),
        ("GPU-", {}, "--gpu-index GPU- matches 2 GPUs: give more of the UUID (GPUs: 0: NVIDIA A100-SXM4-80GB "),
        ("t4", {}, "--gpu-index 't4' is neither an NVML index (0, 1, ...) nor a GPU UUID (GPU-...)"),
        ("-1", {}, "--gpu-index '-1' is neither an NVML index"),
        (
            "0",
            {"CUDA_VISIBLE_DEVICES": "1"},
            "--gpu-index 0 matches no GPU that CUDA_VISIBLE_DEVICES='1' leaves visible "
            "(GPUs: 1: Tesla T4 GPU-bbbbbbbb-1111-2222-3333-444444444444)",
        ),
        ("0", {"CUDA_VISIBLE_DEVICES": ""}, "--gpu-index 0 was given but CUDA_VISIBLE_DEVICES='' hides every GPU"),
    ],
)
def test_gpu_index_that_names_no_usable_gpu_is_one_line(wanted: str, environ: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        choose_device(None, nvml=FakeNvml([a100(), t4()]), environ=environ, gpu_index=wanted)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_gpu_index_among_the_gpus_cuda_visible_devices_leaves() -> None:
    nvml = FakeNvml([a100(), t4()])
    choice = choose_device(None, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "1,0"}, gpu_index="0")
    assert choice.gpu.uuid == A100_UUID and choice.cuda_visible_devices == A100_UUID
    assert choose_device(None, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "1,0"}).gpu.uuid == T4_UUID
    by_uuid = choose_device(None, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": T4_UUID}, gpu_index="1")
    assert by_uuid.gpu.uuid == T4_UUID


def test_gpu_index_with_the_cpu_label_or_without_a_gpu_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^--gpu-index picks the GPU to train on but --gpu cpu trains on the CPU"):
        choose_device("cpu", nvml=FakeNvml([a100()]), environ={}, gpu_index="0")
    with pytest.raises(UsageError, match=r"^--gpu-index 0 was given but no NVIDIA GPU was detected$"):
        choose_device(None, nvml=FakeNvml([]), environ={}, gpu_index="0")


def run_cli(monkeypatch, capsys, tmp_path: Path, nvml: FakeNvml, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_mod, "default_nvml", lambda: nvml)
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("nvml", "args", "message"),
    [
        (FakeNvml([]), ["--gpu-index", "3"], "--gpu-index 3 was given but no NVIDIA GPU was detected"),
        (FakeNvml([a100(), t4()]), ["--gpu-index", "3"], "--gpu-index 3 matches no GPU (GPUs: 0: NVIDIA A100"),
        (FakeNvml([a100()]), ["--gpu", "cpu", "--gpu-index", "0"], "--gpu-index picks the GPU to train on"),
    ],
    ids=["no-gpu", "unknown-index", "cpu-label"],
)
def test_stability_cli_refuses_a_bad_gpu_index_in_one_line(
    monkeypatch, capsys, tmp_path: Path, nvml: FakeNvml, args: list[str], message: str
) -> None:
    code, out, err = run_cli(monkeypatch, capsys, tmp_path, nvml, "stability", *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"detprof: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_stability_cli_refuses_more_jobs_than_the_gpus_free_memory_holds(monkeypatch, capsys, tmp_path: Path) -> None:
    gpu = t4()
    gpu.free_bytes = 5 * GIB
    code, out, err = run_cli(
        monkeypatch, capsys, tmp_path, FakeNvml([a100(), gpu]), "stability", "--gpu-index", "1", "--jobs", "4"
    )
    assert (code, out) == (2, "")
    assert err == (
        "detprof: error: --jobs 4 does not fit on the GPU: 5.0 GiB free and each worker needs 2.0 GiB, "
        "so at most 2 fit; pass --jobs 2\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["sweep", "kernels", "stability", "check"])
def test_every_command_that_picks_a_device_takes_gpu_index(capsys, command: str) -> None:
    assert main([command, "--help"]) == 0
    assert "--gpu-index" in capsys.readouterr().out
