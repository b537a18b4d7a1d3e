"""detprof as its users install it, each time in a fresh virtual environment built from the working tree.

The dev environment has every framework installed, so a read-side module that imports Keras,
scikit-learn or a framework at its top passes every other test, and so does a command that
counts on TensorFlow being there. Here:

- ``pip install detprof`` alone: ``parse``, ``diff``, ``report``, ``baseline`` and ``check``
  work on traces and results this process writes (the tests' own nsys, Kineto and synthetic
  sweep helpers), no framework, Keras, scikit-learn or nvtx can be imported, and every command
  that measures says in one line which extra to install;
- ``make wheelhouse``: every wheel detprof needs beside the framework, and nothing of the
  framework;
- ``detprof[torch]`` as an offline GPU machine installs it: PyTorch is the image's (as a GPU
  image's Python has it, its site packages seen through a ``.pth`` file, as ``make gpu-check``
  sees them: here the dev environment's CPU build, torch and what it requires, and nothing
  else), then detprof from the wheelhouse alone with ``--no-index``. There a sweep, a stability
  study and the kernels bench pick PyTorch without ``--backend``, and neither TensorFlow nor JAX
  is there to fall back on.

Each environment is built once per module, from the one wheel that ``make wheelhouse`` builds of
a copy of the tree (a build writes ``build/`` and ``*.egg-info`` beside its sources), with pip's
index and cache. On the 2-core dev machine: the wheelhouse and the core environment 13 s, the
offline torch environment 6 s (42 s when torch itself was installed into it: 754 MB unpacked and
compiled).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import synthetic_sweep as synth
from fixtures_kineto import simple_gpu_trace
from fixtures_traces import Kernel, a100, write_nsys_sqlite
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from detprof.backends import NO_FRAMEWORK
from detprof.reports import reference_build

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "Makefile", "detprof")
"""What a build of detprof reads (the readme is the package's description), and the Makefile for ``make wheelhouse``."""
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TORCH = "torch"
"""The framework a GPU machine's image has installed; here the dev environment's CPU build (2.13.0)."""
REFERENCE_RUNS = [p for p in (ROOT / "reference").iterdir() if p.is_dir()]
"""Each GPU run kept in the repository, whose figures the package ships (``reports.reference_build``)."""
NOT_INSTALLED_WITH_DETPROF = ("tensorflow", "jax", "torch", "keras", "sklearn", "nvtx")
FRAMEWORK_WHEELS = ("tensorflow", "tensorflow_cpu", "jax", "jaxlib", "torch", "triton")
FRAMEWORK_COMMANDS = ("sweep", "stability", "kernels", "models")
PIP_INSTALL = ("install", "--quiet", "--disable-pip-version-check", "--no-compile")
"""Modules are compiled when first imported (``fresh_env``), not all at install: the environments run a few commands,
and compiling every module of pandas, SciPy, plotly and Keras up front took 14 s of each install here."""
NOT_FROM_HERE = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "KERAS_BACKEND", "PYTHONDONTWRITEBYTECODE"}
"""What would let a fresh environment see the working tree or the dev one, and what would keep its processes from
caching what they compile (CI and this machine set it), as a user's machine does."""


def fresh_env(**extra: str) -> dict[str, str]:
    """This process's environment as a user's machine has it (``NOT_FROM_HERE`` left out), and ``extra``."""
    return {k: v for k, v in os.environ.items() if k not in NOT_FROM_HERE} | extra


def run(
    command: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env or fresh_env(), capture_output=True, text=True, timeout=600
    )


def checked(command: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = run(command, cwd, env)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Venv:
    """A virtual environment of its own (no system site packages) and detprof's command line in it.

    Made without pip, which this interpreter's pip installs into (``pip --python``), as the Makefile builds the GPU
    environment: ensurepip took 4 s of each environment here, and brought a setuptools older than torch requires.
    """

    root: Path

    @classmethod
    def create(cls, root: Path) -> Venv:
        checked([sys.executable, "-m", "venv", "--without-pip", root], root.parent)
        return cls(root)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def install(self, *requirements: str | Path, env: dict[str, str] | None = None) -> None:
        checked([sys.executable, "-m", "pip", "--python", self.python, *PIP_INSTALL, *requirements], self.root, env)

    @property
    def site_packages(self) -> Path:
        (found,) = self.root.glob("lib/python3*/site-packages")
        return found

    def detprof(self, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        return run([self.root / "bin" / "detprof", *args], cwd)

    def importable(self, *modules: str) -> list[str]:
        """Those of ``modules`` that import here; Keras on PyTorch, since left to itself it would try TensorFlow."""
        probe = "import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
        probe += "    except ModuleNotFoundError:\n        continue\n    print(m)\n"
        return checked([self.python, "-c", probe, *modules], self.root, fresh_env(KERAS_BACKEND="torch")).split()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree's sources, for builds to write into."""
    copy = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def core(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """``pip install detprof``: no extra, from the index; the wheel is the wheelhouse's, built as ``pip install
    <repo>`` builds it before installing it."""
    (wheel,) = wheelhouse.glob("detprof-*.whl")
    venv = Venv.create(tmp_path_factory.mktemp("core") / "venv")
    venv.install(wheel)
    return venv


def distributions_needed(name: str) -> dict[str, importlib.metadata.Distribution]:
    """``name``'s distribution in this environment and those it requires on this machine (extras left out), by
    normalised name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = canonicalize_name(todo.pop())
        if key in found:
            continue
        found[key] = dist = importlib.metadata.distribution(key)
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def image_site(folder: Path, framework: str) -> Path:
    """A folder standing for a GPU image's site packages: ``framework`` and what it requires, linked from this
    environment (each distribution's top-level files and its metadata), nothing else."""
    folder.mkdir()
    for dist in distributions_needed(framework).values():
        tops = {Path(str(file)).parts[0] for file in dist.files or () if not str(file).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists():
                (folder / top).symlink_to(source)
    return folder


@pytest.fixture(scope="module")
def with_torch(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The image's PyTorch, then ``detprof[torch]`` as an offline GPU machine installs it: from the wheelhouse alone,
    with no index, no pip configuration (this machine's pip.conf names local indexes) and no other folder of wheels;
    the torch installed satisfies the extra's requirement."""
    root = tmp_path_factory.mktemp("torch")
    venv = Venv.create(root / "venv")
    site = image_site(root / "image-site", TORCH)
    (venv.site_packages / "image.pth").write_text(f"{site}\n")
    offline = fresh_env(PIP_CONFIG_FILE=os.devnull)
    offline.pop("PIP_FIND_LINKS", None)
    venv.install("--no-index", "--find-links", wheelhouse, "detprof[torch]", env=offline)
    return venv


def make_wheelhouse(source: Path, folder: Path, *variables: str) -> list[str]:
    """``make wheelhouse`` for this machine's Python and platform, with the dev environment's pip; the wheels' names."""
    arch = platform.machine()
    command = ["make", "wheelhouse", f"VENV={sys.prefix}", f"WHEELHOUSE={folder}"]
    command += [f"WHEELHOUSE_PYTHON={sys.version_info.major}.{sys.version_info.minor}"]
    command += [f"WHEELHOUSE_PLATFORMS=manylinux_2_28_{arch} manylinux2014_{arch}", *variables]
    checked(command, source)
    return sorted(path.name for path in folder.glob("*.whl"))


@pytest.fixture(scope="module")
def wheelhouse(source: Path) -> Path:
    folder = source.parent / "wheelhouse"
    make_wheelhouse(source, folder)
    return folder


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder outside the tree to run in: nothing there that Python could import detprof from."""
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def write_traces(folder: Path) -> tuple[Path, Path, Path]:
    """Two nsys exports of one step (a deterministic wgrad in place of the default one) and a Kineto trace."""
    conv = Kernel("void conv_fwd<float>(float*)", "conv_fwd", 1_000, 400)
    default = write_nsys_sqlite(
        folder / "default.sqlite",
        [conv, Kernel("void wgrad_alg0_engine<float>()", "wgrad_alg0_engine", 2_000, 300)],
        gpus=[a100(0)],
    )
    deterministic = write_nsys_sqlite(
        folder / "deterministic.sqlite",
        [conv, Kernel("void wgrad_alg1_det<float>()", "wgrad_alg1_det", 2_000, 900)],
        gpus=[a100(0)],
    )
    return default, deterministic, simple_gpu_trace(folder / "run.pt.trace.json.gz", compress=True)


def write_results(folder: Path, median: float, seed: int) -> Path:
    """A sweep's results folder (records and manifest) whose overhead is ``median``."""
    overheads = {"resnet50": synth.noisy_overheads(median, 0.02, 5, seed)}
    return synth.write_sweep(folder, synth.config(["resnet50"], 5), synth.records(overheads))


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_detprof_alone_installs_no_framework_keras_scikit_learn_or_nvtx(core: Venv) -> None:
    assert core.importable("detprof", *NOT_INSTALLED_WITH_DETPROF) == ["detprof"]


def test_detprof_alone_parses_and_diffs_traces(core: Venv, work: Path) -> None:
    default, deterministic, kineto = write_traces(work)
    assert core.detprof("--version", cwd=work).stdout == f"detprof {VERSION}\n"
    parsed = as_json(core.detprof("parse", default, "--format", "json", cwd=work))
    assert (parsed["format"], parsed["kernel_count"], parsed["total_ns"]) == ("nsys-sqlite", 2, 700)
    parsed = as_json(core.detprof("parse", kineto, "--format", "json", cwd=work))
    assert (parsed["format"], parsed["kernel_count"]) == ("kineto-json", 2)
    diffed = as_json(core.detprof("diff", default, deterministic, "--format", "json", cwd=work))
    assert {k["short_name"]: k["status"] for k in diffed["kernels"]} == {
        "conv_fwd": "same",
        "wgrad_alg0_engine": "removed",
        "wgrad_alg1_det": "added",
    }
    table = core.detprof("diff", default, deterministic, cwd=work)  # the rich table, as a user reads it
    assert table.returncode == 0 and "wgrad_alg1_det" in table.stdout, table.stderr


def test_detprof_alone_reports_and_checks_results(core: Venv, work: Path) -> None:
    main = write_results(work / "main", 1.5, seed=1)
    pr = write_results(work / "pr", 2.0, seed=2)
    page = core.detprof("report", main, pr, "-o", work / "report.html", cwd=work)
    assert page.returncode == 0 and (work / "report.html").stat().st_size > 0, page.stderr
    headline = as_json(core.detprof("report", main, "--format", "json", "-o", "-", cwd=work))
    assert [m["model"] for m in headline["models"]] == ["resnet50"]
    # What detprof measured on GPUs came with the wheel (package data), read off the repository's reference/.
    assert headline["measured_on_gpus"] == [asdict(m) for m in reference_build.summarize(REFERENCE_RUNS)]
    assert "Measured by detprof on GPUs" in (work / "report.html").read_text()
    assert core.detprof("report", main, "--format", "md", "-o", "-", cwd=work).stdout.startswith("# detprof")
    assert core.detprof("baseline", main, "-o", work / "baseline.json", cwd=work).returncode == 0
    same = core.detprof("check", "--baseline", work / "baseline.json", "--current", main, cwd=work)
    assert same.returncode == 0 and "1 OK" in same.stdout, same.stdout + same.stderr
    worse = core.detprof("check", "--baseline", work / "baseline.json", "--current", pr, cwd=work)
    assert worse.returncode == 1 and "REGRESSED" in worse.stdout, worse.stdout + worse.stderr


@pytest.mark.parametrize("command", FRAMEWORK_COMMANDS)
def test_detprof_alone_names_the_extras_where_a_command_needs_a_framework(core: Venv, work: Path, command: str) -> None:
    done = core.detprof(command, cwd=work)
    assert (done.returncode, done.stderr) == (2, f"detprof: error: {NO_FRAMEWORK}\n")
    assert not any(work.iterdir())


def test_detprof_alone_is_not_ready_to_measure(core: Venv, work: Path) -> None:
    done = core.detprof("doctor", "--no-smoke", cwd=work)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"missing  framework  {NO_FRAMEWORK}" in done.stdout.splitlines()
    assert done.stdout.splitlines()[-1] == "detprof doctor: not ready for cpu"


def test_the_torch_extra_brings_keras_and_no_other_framework(with_torch: Venv) -> None:
    found = with_torch.importable("torch", "keras", "sklearn", "nvtx", "tensorflow", "jax")
    assert found == ["torch", "keras", "sklearn", "nvtx"]


def test_a_sweep_picks_the_one_framework_installed(with_torch: Venv, work: Path) -> None:
    args = ["--models", "smallcnn", "--steps", "3", "--warmup", "1", "--repeats", "2", "--batch-size", "8"]
    done = with_torch.detprof("sweep", *args, "--input-size", "16", "--no-report", "--out", "res", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((work / "res" / "sweep" / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "torch"
    records = [json.loads(p.read_text()) for p in (work / "res" / "sweep" / "runs").glob("*.json")]
    assert len(records) == 4
    for record in records:
        assert (record["status"], record["backend"], record["tracer"]) == ("ok", "torch", "torch"), record["reason"]
        assert record["versions"]["torch"].startswith("2.13.0") and "tensorflow" not in record["versions"]


def test_a_stability_study_picks_the_one_framework_installed(with_torch: Venv, work: Path) -> None:
    args = ["--variants", "control", "--runs", "2", "--epochs", "1", "--jobs", "1", "--out", "res"]
    done = with_torch.detprof("stability", *args, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in done.stdout
    records = [json.loads(p.read_text()) for p in (work / "res" / "stability" / "runs").glob("*.json")]
    assert [(r["status"], r["backend"]) for r in records] == [("ok", "torch")] * 2


def test_the_kernels_bench_and_keras_applications_need_no_tensorflow(with_torch: Venv, work: Path) -> None:
    """The conv cases are read off a Keras model built in a child process, and a model name that is not one of ours
    is looked up in ``keras.applications`` in detprof's own: both on the framework installed."""
    args = ["--ops", "conv2d_backward_filter", "--kernel-sizes", "3", "--max-shapes", "1", "--steps", "2"]
    args += ["--warmup", "1", "--repeats", "1", "--batch-size", "2", "--input-size", "16", "--out", "res"]
    done = with_torch.detprof("kernels", *args, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(p.read_text()) for p in (work / "res" / "kernels" / "runs").glob("*.json")]
    assert [(r["status"], r["backend"]) for r in records] == [("ok", "torch")] * 2
    planned = with_torch.detprof("sweep", "--models", "convnexttiny", "--dry-run", cwd=work)
    assert planned.returncode == 0 and "backend      torch" in planned.stdout, planned.stdout + planned.stderr


def test_the_wheelhouse_holds_what_detprof_needs_and_nothing_of_a_framework(wheelhouse: Path) -> None:
    names = {path.name.split("-")[0].lower() for path in wheelhouse.glob("*.whl")}
    assert {"detprof", "keras", "scikit_learn", "nvtx", "pandas", "pyarrow", "scipy", "typer"} <= names
    assert not names & set(FRAMEWORK_WHEELS)
    assert {name for name in names if name.startswith("nvidia")} == {"nvidia_ml_py"}  # NVML's bindings, no CUDA


def test_the_wheelhouse_fits_what_the_machine_has_installed(source: Path, tmp_path: Path) -> None:
    """A TensorFlow 2.16 machine has numpy 1.26, which the newest pandas does not run on."""
    installed = tmp_path / "installed.txt"
    installed.write_text("numpy==1.26.4\n")
    wheels = make_wheelhouse(source, tmp_path / "wheelhouse", f"WHEELHOUSE_CONSTRAINTS={installed}")
    assert [name.split("-")[1] for name in wheels if name.startswith("numpy-")] == ["1.26.4"]


def test_an_offline_machine_with_torch_installs_detprof_from_the_wheelhouse(with_torch: Venv, work: Path) -> None:
    default, _, _ = write_traces(work)
    assert with_torch.detprof("--version", cwd=work).stdout == f"detprof {VERSION}\n"
    assert as_json(with_torch.detprof("parse", default, "--format", "json", cwd=work))["kernel_count"] == 2
