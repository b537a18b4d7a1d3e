"""The fleet (``--ray``) on a real local Ray cluster: a sweep across two GPU types, a node killed mid-sweep, resume.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: a head without work, two nodes
that carry Ray's ``accelerator_type:T4`` resource and one that carries ``accelerator_type:A100``,
set by hand as on any test cluster; the nodes have no GPU, so the labels are ``--force``d.
One sweep runs as its own process (the driver, as a user runs it) while the test kills one
T4 node as soon as a unit runs there; every test after it reads that sweep's results or
continues it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from fault_sweeps import processes_naming
from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
from ray.cluster_utils import Cluster

from detprof.cli import main
from detprof.fleet.node_types import RAY_ACCELERATOR_TYPES
from detprof.fleet.transfer import SCRATCH, Bundle, collect, deliver
from detprof.gpu_labels import KNOWN_GPUS
from detprof.store import ResultsStore

MB = 2**20
TINY = ["--models", "smallcnn", "--steps", "2", "--warmup", "0", "--repeats", "2"]
TINY += ["--input-size", "16", "--batch-size", "8", "--backend", "torch", "--tracer", "torch"]
DETPROF = Path(sys.executable).with_name("detprof")
FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
"""Ray's GCS declares a node dead after missing two health checks half a second apart, not the default 30 s."""
RUN_IDS = sorted(f"smallcnn--{mode}--r{r}" for mode in ("default", "deterministic") for r in (0, 1))


def filed(stderr: str) -> list[str]:
    """The runs the progress display reported filed (``sweep t4 [1/4] RUN: ok``, off a terminal) as ``t4/RUN``."""
    lines = [line.split(" ", 2) for line in stderr.splitlines() if line.startswith("sweep ") and "] smallcnn--" in line]
    return [f"{label}/{rest.split('] ')[1].split(':')[0]}" for _sweep, label, rest in lines]


def test_every_known_label_has_the_type_ray_gives_its_boards() -> None:
    """The one table agrees with how Ray names a node's type from its GPU's name, for every board detprof knows."""
    assert set(RAY_ACCELERATOR_TYPES) == set(KNOWN_GPUS)
    for label, boards in KNOWN_GPUS.items():
        named = {NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(board) for board in boards}
        assert named == {RAY_ACCELERATOR_TYPES[label]}, label


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "t4", "--gpu", "a100"], "several GPU types need --ray"),
        (["--ray", "auto"], "--ray needs the GPU types to measure"),
        (["--ray", "auto", "--gpu", "cpu"], "names no GPU type a Ray cluster schedules by"),
        (["--ray", "auto", "--gpu", "t4", "--gpu-index", "0"], "--gpu-index picks a GPU of this machine"),
        (["--ray", "auto", "--gpu", "t4", "--max-trace-mb", "-1"], "--max-trace-mb must be 0 or more"),
        (["--ray", "auto", "--gpu", "t4", "--steps", "0", "--force"], "--steps must be at least 1"),
        (["--ray", "auto", "--gpu", "t4", "--dry-run"], "--dry-run prints one machine's plan"),
    ],
)
def test_fleet_option_mistakes_are_one_line_before_connecting(tmp_path, capsys, args, message) -> None:
    assert main(["sweep", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_address_where_nothing_listens_is_one_line_at_once(tmp_path, capsys) -> None:
    """Ray retries such an address for minutes, printing its connection errors; detprof asks it first."""
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        args = ["sweep", "--ray", address, "--gpu", "t4", "--force", "--out", str(tmp_path / "out")]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"--ray {address}: no Ray cluster to connect to there (Connection refused)" in err, err
        assert err.count("\n") == 1


def test_a_trace_over_the_cap_stays_on_the_node_with_its_path_recorded(tmp_path) -> None:
    node = ResultsStore(tmp_path / "node", "sweep")
    for relative, size in (("logs/r.log", 10), ("tables/r.parquet", 20), ("traces/r.tfprof/p/x.pb", 3 * MB)):
        (node.dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (node.dir / relative).write_bytes(b"x" * size)
    record = {"run_id": "r", "log": "logs/r.log", "kernel_table": "tables/r.parquet", "trace_file": "traces/r.tfprof"}
    bundle = collect(node, [record], ("log", "kernel_table"), max_trace_bytes=2 * MB)
    assert set(bundle.files) == {"logs/r.log", "tables/r.parquet"}
    kept = node.dir / "traces" / "r.tfprof"
    assert bundle.records == [record | {"trace_file": None, "trace_on_node": str(kept)}]
    assert (kept / "p" / "x.pb").is_file() and not (node.dir / "logs").exists()
    home = ResultsStore(tmp_path / "home", "sweep")
    (written,) = deliver(bundle, home, {"ray_node_id": "n1"})
    assert written["ray_node_id"] == "n1" and (home.dir / "tables" / "r.parquet").stat().st_size == 20
    assert json.loads(home.record_path("r").read_text()) == written


def test_a_node_cannot_write_outside_the_study_folder(tmp_path) -> None:
    from detprof.errors import InputError

    with pytest.raises(InputError, match="outside its study folder"):
        deliver(Bundle([], {"../escaped": b"x"}), ResultsStore(tmp_path, "sweep"), {})
    assert not (tmp_path / "escaped").exists()


@pytest.fixture(scope="module")
def cluster():
    """Head (no work), two T4 nodes (the second is killed mid-sweep) and an A100 node, one CPU each."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": 100 * MB,
            "_system_config": FAST_NODE_DEATH,
        },
    )
    nodes = {
        name: cluster.add_node(num_cpus=1, resources={f"accelerator_type:{kind}": 1}, object_store_memory=80 * MB)
        for name, kind in (("t4", "T4"), ("t4-killed", "T4"), ("a100", "A100"))
    }
    cluster.wait_for_nodes()
    yield cluster, nodes
    cluster.shutdown()
    for node in nodes.values():
        for left in Path(tempfile.gettempdir()).glob(f"{SCRATCH}/*/{node.node_id}"):
            shutil.rmtree(left, ignore_errors=True)
            with contextlib.suppress(OSError):
                left.parent.rmdir()


def records(out: Path, label: str) -> dict[str, dict]:
    return {r["run_id"]: r for r in ResultsStore(out / label, "sweep").records()}


@pytest.fixture(scope="module")
def swept(cluster, tmp_path_factory):
    """``detprof sweep --ray`` across T4 and A100 as its own process; one T4 node killed once a unit runs there."""
    ray_cluster, nodes = cluster
    out = tmp_path_factory.mktemp("fleet") / "out"
    victim = nodes["t4-killed"].node_id
    command = [str(DETPROF), "sweep", "--ray", ray_cluster.address, "--gpu", "t4", "--gpu", "a100", "--force"]
    started = time.monotonic()
    with open(out.parent / "stderr.txt", "w") as err, open(out.parent / "stdout.txt", "w") as stdout:
        sweep = subprocess.Popen([*command, *TINY, "--out", str(out)], stdout=stdout, stderr=err)
        killed_unit = None
        while sweep.poll() is None and killed_unit is None:
            running = sorted(Path(tempfile.gettempdir()).glob(f"{SCRATCH}/*/{victim}/*"))
            if running:
                killed_unit = running[0].name
                ray_cluster.remove_node(nodes["t4-killed"], allow_graceful=False)
            time.sleep(0.1)
        code = sweep.wait(timeout=400)
    return {
        "out": out,
        "code": code,
        "stderr": (out.parent / "stderr.txt").read_text(),
        "stdout": (out.parent / "stdout.txt").read_text(),
        "killed_unit": killed_unit,
        "victim": victim,
        "ids": {name: node.node_id for name, node in nodes.items()},
        "seconds": time.monotonic() - started,
    }


@pytest.mark.slow
def test_every_run_of_a_type_runs_on_a_node_of_that_type_and_comes_home(swept) -> None:
    assert swept["code"] == 0, swept["stderr"]
    out, ids = swept["out"], swept["ids"]
    for label, own in (("t4", {ids["t4"], ids["t4-killed"]}), ("a100", {ids["a100"]})):
        found = records(out, label)
        assert sorted(found) == RUN_IDS
        for record in found.values():
            assert record["status"] == "ok", record["reason"]
            assert record["ray_node_id"] in own and record["ray_node_address"]
            assert record["device"]["label"] == label and record["device"]["forced"] is True
            study = out / label / "sweep"
            for name in ("log", "kernel_table", "trace_file"):
                assert (study / record[name]).exists(), name
        manifest = json.loads((out / label / "sweep" / "manifest.json").read_text())
        assert manifest["config"]["gpu_label"] == label and manifest["config"]["models"] == ["smallcnn"]
    report = (out / "report.html").read_text()
    assert "<td>t4</td>" in report and "<td>a100</td>" in report


@pytest.mark.slow
def test_a_node_killed_mid_sweep_loses_nothing_and_records_nothing_twice(swept) -> None:
    """The unit that ran on the killed node ran again, whole, on the other T4 node; every run was filed once."""
    assert swept["code"] == 0, swept["stderr"]
    assert swept["killed_unit"] is not None, "no unit ran on the node to kill"
    t4 = records(swept["out"], "t4")
    killed_pair = [r for r in t4.values() if r["repeat"] == t4[swept["killed_unit"]]["repeat"]]
    assert len(killed_pair) == 2
    assert {r["ray_node_id"] for r in killed_pair} == {swept["ids"]["t4"]}
    times = Counter(filed(swept["stderr"]))
    assert set(times.values()) == {1} and len(times) == 8, times
    assert f"lost on node {swept['victim'][:12]}" in swept["stderr"], swept["stderr"]


@pytest.mark.slow
def test_resume_measures_only_what_is_missing_and_keeps_big_traces_on_the_node(cluster, swept, capsys) -> None:
    ray_cluster, _ = cluster
    out = swept["out"]
    before, t4_before = records(out, "a100"), records(out, "t4")
    gone = [run_id for run_id, r in before.items() if r["repeat"] == 1]
    for run_id in gone:
        ResultsStore(out / "a100", "sweep").record_path(run_id).unlink()
    command = ["sweep", "--ray", ray_cluster.address, "--gpu", "t4", "--gpu", "a100", "--force", *TINY]
    assert main([*command, "--out", str(out), "--resume", "--max-trace-mb", "0", "--no-report"]) == 0
    err = capsys.readouterr().err
    assert sorted(filed(err)) == sorted(f"a100/{run_id}" for run_id in gone)
    after = records(out, "a100")
    for run_id, record in after.items():
        if run_id in gone:
            assert record["trace_file"] is None and Path(record["trace_on_node"]).exists()
        else:
            assert record == before[run_id]
    assert records(out, "t4") == t4_before


@pytest.mark.slow
def test_a_type_the_cluster_lacks_is_one_line_before_anything_runs(cluster, tmp_path, capsys) -> None:
    ray_cluster, _ = cluster
    code = main(["sweep", "--ray", ray_cluster.address, "--gpu", "t4", "--gpu", "v100", "--force", *TINY])
    err = capsys.readouterr().err
    assert code == 2 and "no live node of accelerator type V100" in err and "A100" in err and "T4" in err


@pytest.mark.slow
def test_nodes_whose_doctor_finds_no_gpu_are_left_out_without_force(cluster, tmp_path, capsys) -> None:
    """Without --force a CPU-only node is not a T4: the doctor's check on the node says so, and nothing runs."""
    ray_cluster, _ = cluster
    out = tmp_path / "out"
    code = main(["sweep", "--ray", ray_cluster.address, "--gpu", "t4", *TINY, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "no T4 node is ready" in err and "NVML sees no NVIDIA GPU" in err
    assert not out.exists()


@pytest.mark.slow
def test_check_run_measures_on_the_fleet_with_the_baselines_settings(cluster, swept, tmp_path, capsys) -> None:
    """``check --run --ray`` runs its sweep through the same fleet: here it stops at the type the cluster lacks."""
    ray_cluster, _ = cluster
    baseline = tmp_path / "baseline.json"
    assert main(["baseline", str(swept["out"] / "t4"), "-o", str(baseline)]) == 0
    check = ["check", "--baseline", str(baseline), "--run", "--ray", ray_cluster.address, "--out", str(tmp_path / "c")]
    assert main([*check, "--gpu", "t4", "--gpu", "a100"]) == 2
    assert "compares one GPU type with its baseline" in capsys.readouterr().err
    assert main([*check, "--gpu", "v100", "--force"]) == 2
    assert "no live node of accelerator type V100" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_a_stability_study_trains_its_runs_on_the_nodes_of_its_type(cluster, tmp_path, capsys) -> None:
    ray_cluster, nodes = cluster
    out = tmp_path / "out"
    args = ["stability", "--ray", ray_cluster.address, "--gpu", "a100", "--force", "--variants", "control"]
    assert main([*args, "--runs", "2", "--epochs", "1", "--out", str(out)]) == 0, capsys.readouterr().err
    store = ResultsStore(out, "stability")
    found = list(store.records())
    assert len(found) == 2
    for record in found:
        assert record["status"] == "ok" and record["ray_node_id"] == nodes["a100"].node_id
        assert (store.dir / record["arrays"]).is_file() and (store.dir / record["log"]).is_file()
    summary = json.loads((store.dir / "summary.json").read_text())
    assert summary["device"] == "a100" and summary["runs_ok"] == 2


@pytest.mark.slow
def test_sigterm_to_a_fleet_driver_cancels_its_units_and_keeps_what_came_home(cluster, tmp_path) -> None:
    ray_cluster, nodes = cluster
    node = nodes["a100"].node_id
    out = tmp_path / "out"
    command = [str(DETPROF), "sweep", "--ray", ray_cluster.address, "--gpu", "a100", "--force", *TINY, "--no-report"]
    driver = subprocess.Popen([*command, "--out", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not processes_naming(f"{SCRATCH}/") or not any(Path(tempfile.gettempdir()).glob(f"{SCRATCH}/*/{node}/*")):
        assert driver.poll() is None and time.monotonic() < deadline, "no unit started on the node"
        time.sleep(0.1)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 143, err
    assert "terminated (SIGTERM): every completed run is kept in" in err and "Traceback" not in err
    deadline = time.monotonic() + 30
    while processes_naming(f"{SCRATCH}/"):
        assert time.monotonic() < deadline, "a cancelled unit's workers still run on the node"
        time.sleep(0.2)
