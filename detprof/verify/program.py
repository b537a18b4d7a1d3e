"""``detprof verify --command``: a training program detprof did not write, run twice per mode, its runs compared.

The program runs as ``sweep --command`` runs it (``profiler.program``): its command split like
a shell's, the same in every run, each run a fresh process in its mode's environment with the
hook that switches determinism on and reports what was in effect (a deterministic run without
it is failed), untraced. Its spec names a fingerprints folder, where what the program
fingerprinted (``detprof.fingerprint``) is written when its window closes, in the files and
form of a model's (``fingerprints.RunFingerprints``), so ``analysis.verification`` compares the
two runs of a mode as it compares a model's, and, for a program that fingerprinted nothing,
says so and compares how they ended. Records are of kind "verify", the program's ``--name`` as
their model, with its ``program`` (exit status, stderr, window) as a swept program's.

The runs go one at a time, also on a CPU where a model's two run side by side: a program may
write files of its own (checkpoints, a downloaded data set) that two copies at once would share.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from detprof.analysis.verification import verifications
from detprof.determinism import Mode
from detprof.errors import last_line
from detprof.findings import program_finding
from detprof.fingerprints import FINGERPRINTS_FILE
from detprof.invocation import command_line
from detprof.options import RunOptions
from detprof.profiler.measured_runs import study_root
from detprof.profiler.presets import PRESETS
from detprof.profiler.process import WorkerEnvironment
from detprof.profiler.program.files import ProgramSpec, in_effect, read_window
from detprof.profiler.program.request import ProgramRequest, ProgramSettings
from detprof.profiler.program.run import (
    program_backend,
    program_env,
    program_fields,
    program_status,
    run_process,
    stderr_tail,
)
from detprof.profiler.progress import progress_bar
from detprof.profiler.tracers import NO_TRACER
from detprof.profiler.worker_process import utc_now
from detprof.records import VerifyRun, verify_run
from detprof.store import ResultsStore, atomic_write_json
from detprof.verify.run import REPLICAS, VERIFY_ORDER, VerifyOutcome, run_id
from detprof.version import detprof_version


@dataclass(frozen=True)
class ProgramVerifyRequest:
    """``verify --command --name`` and the shared options as given."""

    command: str
    name: str | None
    options: RunOptions


def verify_program(request: ProgramVerifyRequest, *, console: Console) -> VerifyOutcome:
    """The program's four runs not already recorded, then its runs compared."""
    options = replace(request.options, tracer="none")
    settings, target = ProgramRequest(request.command, request.name, options).resolve(list(PRESETS))
    manifest = {
        "program": settings.manifest()["program"],
        "backend": target.backend,
        "gpu_label": target.device.label,
    }
    out = study_root(request.options.out, target.device, target.backend, "verify", manifest, [settings.name])
    store = ResultsStore(out, "verify")
    store.open(manifest, command_line(), resume=request.options.resume)
    runs = [(mode, replica) for mode in VERIFY_ORDER for replica in REPLICAS]
    console.print(
        f"detprof verify: program {escape(settings.name)} x 2 modes x 2 runs on {escape(target.device.label)}, "
        f"results in {escape(str(out))}"
    )
    environment = WorkerEnvironment(target.device)
    with progress_bar(console, "verify", len(runs), store.dir) as progress:
        for index, (mode, replica) in enumerate(runs):
            if store.is_done(run_id(settings.name, mode, replica)):
                continue
            progress.on_start(f"{settings.name} {mode} {replica}", index)
            progress.on_done(_run(store, environment, settings, mode, replica))
    return VerifyOutcome(store.dir, tuple(verifications(store)))


def _run(
    store: ResultsStore, environment: WorkerEnvironment, settings: ProgramSettings, mode: Mode, replica: str
) -> VerifyRun:
    """One run of the program in a fresh process; its record, written whatever happened."""
    this = run_id(settings.name, mode, replica)
    folder = Path("fingerprints") / this
    work, logs = store.dir / "work", store.dir / "logs"
    spec_path, window_path = work / f"{this}.spec.json", work / f"{this}.window.json"
    in_effect_dir, log, stderr_path = work / f"{this}.in-effect", logs / f"{this}.log", logs / f"{this}.stderr.log"
    for stale in (store.dir / folder, in_effect_dir):  # an interrupted attempt's
        shutil.rmtree(stale, ignore_errors=True)
    window_path.unlink(missing_ok=True)
    in_effect_dir.mkdir(parents=True)
    logs.mkdir(exist_ok=True)
    spec = ProgramSpec(this, mode, NO_TRACER.name, None, str(window_path), str(store.dir / folder))
    atomic_write_json(spec_path, spec.to_json())
    argv = list(settings.command)
    started, t0 = utc_now(), time.monotonic()
    timeout_s = settings.run_timeout_s
    env = program_env(environment, mode, spec_path, in_effect_dir, settings.program_seed)
    outcome = run_process(argv, env, log, stderr_path, timeout_s)
    duration_s = round(time.monotonic() - t0, 3)
    window, effect, stderr = read_window(window_path), in_effect(in_effect_dir, mode), stderr_tail(stderr_path)
    status, reason = program_status(outcome, effect, stderr, mode, timeout_s)
    backend = program_backend(settings.backend, effect)
    finding = program_finding(last_line(stderr), backend).to_json() if status == "unsupported" else None
    record = verify_run(
        run_id=this,
        model=settings.name,
        mode=mode,
        replica=replica,
        status=status,
        reason=reason,
        backend=backend,
        steps=0 if window is None else len(window.step_wall_ns),
        steps_asked=None,
        fingerprints=str(folder) if (store.dir / folder / FINGERPRINTS_FILE).is_file() else None,
        finding=finding,
        **({"settings": effect.settings(mode)} if effect.processes else {}),
        versions=effect.versions | {"detprof": detprof_version()},
        device=environment.device.as_record(),
        started_at=started,
        finished_at=utc_now(),
        duration_s=duration_s,
        log=str(log.relative_to(store.dir)),
        program=program_fields(argv, outcome, stderr, str(stderr_path.relative_to(store.dir)), window, effect),
    )
    store.write_record(dict(record))
    spec_path.unlink()
    window_path.unlink(missing_ok=True)
    shutil.rmtree(in_effect_dir, ignore_errors=True)
    return record
