"""A stability study: plan the runs, execute them in pooled workers, summarize from the store.

Runs are grouped by determinism mode, one process pool per mode, because a process cannot
leave deterministic mode once in it; each worker serves many runs so the framework starts a
handful of times instead of once per run. Every worker runs the study's Keras backend
(``--backend``); no process of the study loads a framework the study does not use. When
there are at least as many jobs as modes, the pools run side by side with the jobs split
in proportion to their runs, so neither mode waits for the other; with fewer jobs the
modes take turns. On a GPU every worker sees the chosen card only, and one job runs by
default: more must fit in its free memory, and then each worker grows its memory as it
goes instead of taking it all at start (``gpu_env``). Every finished run is written to the
store at once, so Ctrl-C or a crash loses only the runs in flight.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from detprof import backends, interrupts, locks
from detprof.determinism import MODES, Mode, without_implied
from detprof.errors import UsageError, first_line
from detprof.invocation import Invocation
from detprof.models import kinds, own, registry
from detprof.profiler.devices import DeviceChoice, Nvml, free_memory, usable_cpus
from detprof.profiler.gpu_env import gpu_env
from detprof.profiler.measured_runs import study_root
from detprof.profiler.progress import progress_bar
from detprof.profiler.worker_call import call_in_worker
from detprof.records import StabilityRun, stability_run
from detprof.stability import datasets, variant_metrics, worker
from detprof.stability.training import TrainConfig
from detprof.stability.variants import DEFAULT_VARIANTS, PlannedRun, Variant, parse_variants, plan_runs
from detprof.store import ResultsStore, json_safe

EMBEDDED_MODEL = "smallcnn"
EMBEDDED_DATASET = datasets.DEFAULT_IMAGES
EMBEDDED_RUNS = 5
DEFAULT_RUNS = 10
DEFAULT_EPOCHS = 60
"""Sized for the embedded default: smallcnn reaches about 94% on digits, and the whole default
study (20 runs) takes about a minute on 2 cores. Larger datasets want --epochs of their own."""
DEFAULT_BATCH_SIZE = 128
DEFAULT_LR = 4e-4
MAX_ATTEMPTS = 2
"""A run whose worker process died under it is retried once in a fresh pool, then recorded as failed."""
GIB = 2**30
GPU_BYTES_PER_JOB = 2 * GIB
"""Free GPU memory each parallel worker needs, at the least: a TensorFlow process's CUDA context
and cuDNN/cuBLAS workspaces alone take about a gigabyte before the model, its batches and its
optimizer state. A floor, not a promise: a larger model may still run out, and is then recorded
as out of memory."""

POLL_S = 0.5
"""How often the driver looks up from its pool's results for an interrupt that Python swallowed (``interrupts``)."""


TOKEN_DATASET = "markov"
TOKEN_EPOCHS = 20
"""gpt_tiny's held-out loss on the Markov language at Adam 4e-4: 3.15 nats after 10 epochs (its entropy rate 2.35,
its token frequencies' entropy 4.08), 2.79 after 20."""


def default_dataset(model: str) -> str | None:
    """The built-in data a model takes: the Markov language for a registry model of tokens, else digits; None for
    your own model, whose inputs tell once a worker has looked (``_fitted``)."""
    if own.is_own(model):
        return None
    return TOKEN_DATASET if registry.get(model).takes == "tokens" else EMBEDDED_DATASET


def default_epochs(dataset: str | None) -> int | None:
    """The epochs a dataset's study trains; None until the dataset is known."""
    if dataset is None:
        return None
    return TOKEN_EPOCHS if datasets.canonical_name(dataset) == TOKEN_DATASET else DEFAULT_EPOCHS


def default_runs(model: str, dataset: str | None) -> int:
    """5 for the embedded smallcnn-on-digits default (it must finish in minutes), else the protocol's 10."""
    if model.strip().lower() == EMBEDDED_MODEL and (dataset or "").strip().lower() == EMBEDDED_DATASET:
        return EMBEDDED_RUNS
    return DEFAULT_RUNS


@dataclass(frozen=True)
class StudyConfig:
    model: str = EMBEDDED_MODEL
    dataset: str | None = EMBEDDED_DATASET
    """None: your own model's default, the Markov language for a model of tokens, else digits (``_fitted``)."""
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    runs: int = EMBEDDED_RUNS
    epochs: int | None = DEFAULT_EPOCHS
    """None: the dataset's default (``default_epochs``), once an own model's dataset is known."""
    batch_size: int = DEFAULT_BATCH_SIZE
    lr: float = DEFAULT_LR
    seed: int = 0
    keep_weights: bool = False
    backend: str | None = backends.DEFAULT
    """The backend every worker trains on (``--backend``; None: not given, PyTorch for a native module, else the
    installed one's)."""
    keep_saved_weights: bool = False
    """A saved model of your own (``FILE.keras``) starts every run from its saved weights (``--keep-saved-weights``)."""
    own_model: own.OwnModel | None = None
    """``model`` is your own: its spec as ``validated`` parsed it and ``run_study`` inspected it (its file's hash)."""

    @property
    def label(self) -> str:
        """The model's name in the summary and the tables: the registry name, or your function's or file's name."""
        return self.model if self.own_model is None else self.own_model.label

    def validated(self) -> tuple[StudyConfig, list[Variant]]:
        """Every name and number checked, names made canonical, before anything is trained (or any worker started)."""
        kind = None if self.own_model is not None or own.is_own(self.model) else registry.kind_of(self.model)
        backend = backends.require(kind.backend if kind is not None and self.backend is None else self.backend).name
        if kind is not None:
            kinds.refuse_other_backend(self.model, kind.api, backend)
        if self.runs < 2:
            raise UsageError(f"--runs must be at least 2 (got {self.runs}): a spread needs two runs")
        if self.epochs is not None and self.epochs < 1:
            raise UsageError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive (got {self.lr})")
        if self.seed < 0:
            raise UsageError(f"--seed must be a whole number from 0 up (got {self.seed})")
        variants = parse_variants(",".join(self.variants))
        mine = own.parse(self.model) if own.is_own(self.model) else None
        if kind is not None:
            mine = registry.native_model(self.model)
        if self.keep_saved_weights and (mine is None or mine.kind != "saved"):
            raise UsageError("--keep-saved-weights applies to a saved model of your own (--model FILE.keras)")
        if mine is None:
            dataset: str | None = datasets.canonical_name(self.dataset or str(default_dataset(self.model)))
            _refuse_other_inputs(registry.get(self.model), str(dataset))
        else:
            dataset = None if self.dataset is None else datasets.canonical_name(self.dataset)
        canonical = StudyConfig(
            registry.get(self.model).name if mine is None else mine.given,
            dataset,
            tuple(v.name for v in variants),
            self.runs,
            self.epochs if self.epochs is not None else default_epochs(dataset),
            self.batch_size,
            self.lr,
            self.seed,
            self.keep_weights,
            backend,
            self.keep_saved_weights,
            mine,
        )
        return canonical, variants

    def manifest(self) -> dict[str, Any]:
        """What a resumed study must match. TensorFlow's leaves the backend out, as studies did before
        there was a choice, so that those still resume; any other backend is named. A model of your
        own adds its spec, so that a study of a changed model does not resume into the old one's."""
        config = without_implied(asdict(self))
        if not self.keep_saved_weights:
            config.pop("keep_saved_weights")
        if self.own_model is None:
            config.pop("own_model")
        return config


def _refuse_other_inputs(spec: registry.ModelSpec, dataset: str) -> None:
    if spec.takes != datasets.takes(dataset):
        raise UsageError(_other_inputs(spec.name, spec.takes, dataset))


def _other_inputs(model: str, takes: str, dataset: str) -> str:
    """One line for a model of tokens given images, or of images given tokens: the dataset it takes instead."""
    hint = "--dataset markov or npz:PATH of token ids" if takes == "tokens" else "an image dataset"
    return f"{model} takes {takes} and {dataset} holds {datasets.takes(dataset)}: give it {hint}"


OMP_THREADS_ENV = "OMP_NUM_THREADS"
"""OpenMP's thread count (PyTorch's compute threads), where the user sets one."""


def default_jobs(device: DeviceChoice | None = None) -> int:
    """On a GPU one: the workers would share its memory and its compute, and one worker
    keeps the GPU busy. On the CPU usable cores, at most 4, the cores shared out among them
    (``cpu_threads``)."""
    if device is not None and device.gpu is not None:
        return 1
    return max(1, min(usable_cpus(), 4))


def cpu_threads(device: DeviceChoice, jobs: int, env: Mapping[str, str] = os.environ) -> int | None:
    """Each worker's compute threads where several train on the CPU at once: its share of the usable cores, never
    more than the user's own ``OMP_NUM_THREADS`` (None: the framework's own, on a GPU or for a lone worker). Each
    framework would take every core: PyTorch's threads then spin waiting for each other while their cores run the
    other workers' (a small CNN's epoch on digits 0.15 s alone, 5 s beside one other such worker on two cores)."""
    if device.gpu is not None or jobs == 1:
        return None
    share = max(1, usable_cpus() // jobs)
    own = env.get(OMP_THREADS_ENV, "").split(",")[0].strip()
    return min(share, int(own)) if own.isdigit() and int(own) > 0 else share


def gpu_jobs_that_fit(free_bytes: int, per_job: int = GPU_BYTES_PER_JOB) -> int:
    """How many workers one GPU holds: each needs ``per_job`` of the free memory; one always may try."""
    return max(1, free_bytes // per_job)


def refuse_jobs_over_memory(jobs: int, free_bytes: int | None, per_job: int = GPU_BYTES_PER_JOB) -> None:
    """Refuse ``--jobs`` beyond what the GPU's free memory holds, saying how many fit.

    Refused rather than reduced: the user asked for that many, and a study that silently
    runs with fewer takes longer than planned. ``free_bytes`` None (NVML could not tell)
    lets any number through; a worker that then runs out is recorded as out of memory.
    """
    if jobs <= 1 or free_bytes is None:
        return
    fit = gpu_jobs_that_fit(free_bytes, per_job)
    if jobs > fit:
        raise UsageError(
            f"--jobs {jobs} does not fit on the GPU: {free_bytes / GIB:.1f} GiB free and each worker needs "
            f"{per_job / GIB:.1f} GiB, so at most {fit} fit{'s' if fit == 1 else ''}; pass --jobs {fit}"
        )


def check_jobs(jobs: int, device: DeviceChoice, nvml: Nvml | None = None) -> None:
    """``--jobs`` must be at least 1 and, on a GPU, fit in its free memory (on the CPU any number does)."""
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {jobs})")
    if device.gpu is not None and jobs > 1:
        refuse_jobs_over_memory(jobs, free_memory(device.gpu, nvml))


def allocate_workers(pending: dict[Mode, int], jobs: int) -> list[dict[Mode, int]]:
    """Phases of concurrently running pools: ``[{mode: workers}, ...]``.

    With ``jobs >= modes`` one phase holds every mode, each with at least one worker and
    the rest handed out where the runs per worker are highest; never more workers than runs.
    """
    modes = [m for m in MODES if pending.get(m, 0) > 0]
    if not modes:
        return []
    if jobs < len(modes):
        return [{m: min(jobs, pending[m])} for m in modes]
    shares = dict.fromkeys(modes, 1)
    for _ in range(jobs - len(modes)):
        open_modes = [m for m in modes if shares[m] < pending[m]]
        if not open_modes:
            break
        busiest = max(open_modes, key=lambda m: pending[m] / shares[m])
        shares[busiest] += 1
    return [shares]


@dataclass
class _Lane:
    """One mode's pool, its queue and the runs in flight (never more than its workers)."""

    mode: Mode
    workers: int
    queue: deque[PlannedRun]
    initargs: tuple[Any, ...]
    tasks_per_worker: int | None
    pool: ProcessPoolExecutor | None = None
    in_flight: dict[Future[dict[str, Any]], PlannedRun] = field(default_factory=dict)

    def start(self) -> None:
        self.pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=worker.initialize,
            initargs=self.initargs,
            max_tasks_per_child=self.tasks_per_worker,
        )

    def fill(self, config: TrainConfig) -> None:
        assert self.pool is not None
        while self.queue and len(self.in_flight) < self.workers:
            run = self.queue.popleft()
            self.in_flight[self.pool.submit(worker.execute, run, config)] = run

    def stop(self, *, cancel: bool) -> None:
        """Shut the pool down once its workers are done, or (``cancel``) once ``_ending_new_children`` ended them:
        the pool's manager thread is joined either way, so that none is left for the interpreter's exit to wake
        through a pipe whose workers are gone (Python 3.11 then prints a ``BrokenPipeError``)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=cancel)
            self.pool = None


@contextmanager
def _ending_new_children(lanes: list[_Lane]) -> Iterator[None]:
    """On Ctrl-C or an error, end the worker processes this block started (they ignore SIGINT), then the lanes'
    pools; once the block ends, the pools."""
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        yield
    except BaseException:
        for child in multiprocessing.active_children():
            if child.pid not in before:
                child.terminate()
        for lane in lanes:
            lane.stop(cancel=True)
        raise
    for lane in lanes:
        lane.stop(cancel=False)


def execute_runs(
    runs: list[PlannedRun],
    config: TrainConfig,
    jobs: int,
    on_record: Callable[[dict[str, Any]], None],
    on_start: Callable[[list[PlannedRun]], None] = lambda _: None,
    tasks_per_worker: int | None = None,
    *,
    device: DeviceChoice,
) -> None:
    """Run everything on ``device``, calling ``on_record`` with each finished run's record as it arrives.

    ``tasks_per_worker=1`` gives every run a fresh process (the baseline pooling is measured
    against); the default keeps workers for the life of the pool. With more than one job the
    workers share the GPU, so each grows its memory as it needs it (``gpu_env``).
    """
    env = gpu_env(device, shares_gpu=jobs > 1)
    threads = cpu_threads(device, jobs)
    attempts: Counter[str] = Counter()
    for phase in allocate_workers(dict(Counter(r.mode for r in runs)), jobs):
        lanes = [
            _Lane(
                mode,
                workers,
                deque(r for r in runs if r.mode == mode),
                (config.settings(mode), config.study_dir, env, config.keras, threads),
                tasks_per_worker,
            )
            for mode, workers in phase.items()
        ]
        with _ending_new_children(lanes):
            for lane in lanes:
                lane.start()
                lane.fill(config)
            while any(lane.in_flight for lane in lanes):
                on_start([run for lane in lanes for run in lane.in_flight.values()])
                futures = [f for lane in lanes for f in lane.in_flight]
                done, _ = wait(futures, timeout=POLL_S, return_when=FIRST_COMPLETED)
                interrupts.raise_pending()
                for lane in lanes:
                    finished = [f for f in lane.in_flight if f in done]
                    broken = any(isinstance(f.exception(), BrokenProcessPool) for f in finished)
                    for f in finished:
                        if not isinstance(f.exception(), BrokenProcessPool):
                            on_record(_record_of(f, lane.in_flight.pop(f), config.backend))
                    if broken:
                        _recover(lane, attempts, on_record, config.backend)
                    lane.fill(config)


def _record_of(future: Future[dict[str, Any]], run: PlannedRun, backend: str) -> dict[str, Any]:
    exc = future.exception()
    if exc is None:
        return future.result()
    return _failed(run, first_line(exc, with_type=True), backend)


def _failed(run: PlannedRun, reason: str, backend: str) -> StabilityRun:
    """A run whose worker could not report it: the parent writes its record, backend included."""
    return stability_run(
        run_id=run.run_id,
        variant=run.variant,
        run=run.run_index,
        mode=run.mode,
        seeds=run.seeds.as_dict(),
        status="failed",
        reason=reason,
        backend=backend,
    )


def _recover(lane: _Lane, attempts: Counter[str], on_record: Callable[[dict[str, Any]], None], backend: str) -> None:
    """A worker died: every run in flight in that pool is retried once in a fresh pool, then failed."""
    stranded = list(lane.in_flight.values())
    lane.in_flight.clear()
    lane.stop(cancel=True)
    for run in reversed(stranded):
        attempts[run.run_id] += 1
        if attempts[run.run_id] >= MAX_ATTEMPTS:
            on_record(_failed(run, "the worker process died while running it (crash or out of memory)", backend))
        else:
            lane.queue.appendleft(run)
    lane.start()


@dataclass(frozen=True)
class StudyOutcome:
    store: ResultsStore
    summary: dict[str, Any]
    summary_path: Path
    ran: int
    skipped: int


@dataclass(frozen=True)
class Workers:
    """Where and how a study's runs train: the device, how many at once, how many runs a worker process takes
    before a fresh one replaces it (None: it lives as long as its pool), and what runs them (``execute_runs``'s
    signature; None: this machine's pools; a fleet's executor spreads them over its nodes)."""

    device: DeviceChoice
    jobs: int
    tasks_per_worker: int | None = None
    execute: Callable[..., None] | None = None


def run_study(
    config: StudyConfig, out: Path | None, given: Invocation, workers: Workers, console: Console | None = None
) -> StudyOutcome:
    """Train every planned run not already done, by ``workers``, into ``out`` (None: the day's folder, or one of
    the study's own in it: ``measured_runs.study_root``), then summarize."""
    device, jobs, execute = workers.device, workers.jobs, workers.execute
    check_jobs(jobs, device)
    asked_backend = config.backend
    config, variants = config.validated()
    data = load_in_parent(config.dataset or EMBEDDED_DATASET, str(config.backend))
    if config.own_model is not None:
        config, data = _fitted(config, data)
        config = _on_its_backend(config, asked_backend)
    manifest = {**config.manifest(), "device": device.label}
    store = ResultsStore(study_root(out, device, config.backend, "stability", manifest, [config.label]), "stability")
    holds = (device.lock_key, device.label) if execute is None else None
    with locks.holding(
        store.dir, holds, wait=given.wait, first=partial(store.open, manifest, given.command, resume=given.resume)
    ):
        planned = plan_runs(variants, config.runs, config.seed)
        pending = [r for r in planned if not _trained(store, r.run_id)]
        train_config = TrainConfig(
            config.label,
            config.dataset,
            config.epochs,
            config.batch_size,
            config.lr,
            config.keep_weights,
            str(store.dir),
            config.backend,
            config.own_model,
            config.keep_saved_weights,
        )
        console = console or Console()
        with progress_bar(console, f"stability of {config.label}", len(planned), store.dir) as progress:
            progress.on_start("starting", len(planned) - len(pending))

            def show_running(running: list[PlannedRun]) -> None:
                labels = ", ".join(f"{r.variant} r{r.run_index}" for r in running)
                progress.on_start(f"running {labels}", progress.done_count)

            def store_record(record: dict[str, Any]) -> None:
                store.write_record(record)
                progress.on_done(record)

            run_all = execute or execute_runs
            run_all(pending, train_config, jobs, store_record, show_running, workers.tasks_per_worker, device=device)
        result = write_summary(store, config, variants, data, device)
        return StudyOutcome(store, result, store.dir / "summary.json", len(pending), len(planned) - len(pending))


def _trained(store: ResultsStore, run_id: str) -> bool:
    """Done, with what its summary reads: a run whose record or arrays were damaged (a disk full, a copy cut short)
    is trained again by ``--resume`` rather than ending the study's summary on an unreadable file."""
    if not store.is_done(run_id):
        return False
    record = store.last_record(run_id) or {}
    return record.get("status") != "ok" or variant_metrics.readable_arrays(store.dir / str(record.get("arrays")))


def _on_its_backend(config: StudyConfig, asked: str | None) -> StudyConfig:
    """A native module trains on its framework: implied where no ``--backend`` was given, else one line."""
    assert config.own_model is not None
    kind = kinds.native(config.own_model.api)
    if kind is None or config.backend == kind.backend:
        return config
    if asked is not None:
        kinds.refuse_other_backend(config.label, kind.api, config.backend)
    return replace(config, backend=backends.require(str(kind.backend)).name)


def fed_instead(data: datasets.Dataset) -> str:
    """What a module that fails on the study's batch is told to take instead: the study feeds it the dataset, so
    another dataset (it has no ``--input-shape``)."""
    if data.takes == "tokens":
        fed = f"sequences of {data.input_shape[0]} token ids"
    else:
        fed = f"{own.shape_text(data.input_shape)} images, HxWxC; channels first to a PyTorch module"
    shapes = ", ".join(f"{name} {own.shape_text(shape)}" for name, shape in datasets.IMAGE_SHAPES.items())
    return (
        f"a stability study feeds it {data.name} ({fed}): give a --dataset it takes (images: {shapes}; token ids: "
        f"{TOKEN_DATASET}) or npz:PATH with x_train of those (images HxWxC or CxHxW, token ids)"
    )


def _fitted(config: StudyConfig, data: datasets.Dataset) -> tuple[StudyConfig, datasets.Dataset]:
    """Your model loaded in a worker before any run and checked against the dataset (``_checked``). Without
    ``--dataset`` the dataset is the default for what the model takes, as for a registry model: the Markov language
    for a model of tokens (inspected again, for its length and vocabulary), else ``data``, the default images; the
    epochs, unless given, that dataset's."""
    assert config.own_model is not None
    item = _inspected(config.own_model, data, str(config.backend))
    if config.dataset is None:
        dataset = TOKEN_DATASET if _takes_tokens(item) else data.name
        epochs = config.epochs if config.epochs is not None else default_epochs(dataset)
        config = replace(config, dataset=dataset, epochs=epochs)
        if dataset != data.name:
            data = load_in_parent(dataset, str(config.backend))
            item = _inspected(config.own_model, data, str(config.backend))
    return replace(config, own_model=_checked(item, data)), data


def _takes_tokens(item: own.Inspected) -> bool:
    """One input of a sequence of integer ids: a model of tokens."""
    return len(item.inputs) == 1 and len(item.inputs[0].shape) == 1 and item.inputs[0].dtype.startswith("int")


def _inspected(model: own.OwnModel, data: datasets.Dataset, backend: str) -> own.Inspected:
    (item,) = own.inspect_with(
        call_in_worker,
        [model],
        backend=backend,
        input_shape=data.input_shape,
        classes=data.classes,
        fed=fed_instead(data),
    )
    return item


def _checked(item: own.Inspected, data: datasets.Dataset) -> own.OwnModel:
    """Your model as inspected, checked against the dataset in one line.

    A study trains a classifier of images: one input whose channels are the images' (its
    height and width may differ: the images are resized in the step, as for a registry
    model), one output with a score per class of the dataset; or a model of tokens: one
    input of a sequence's ids, one output of a score per vocabulary entry at each position. A factory that takes
    ``(input_shape, classes)`` is built for the dataset's. Every model trains with the
    study's protocol (Adam at ``--lr``, sparse cross-entropy), compiled or not, so that the
    variants compare like with like.
    """
    if len(item.inputs) != 1 or len(item.outputs) != 1:
        raise UsageError(
            f"{item.label} has {len(item.inputs)} input(s) and {len(item.outputs)} output(s): a stability study "
            "trains an image classifier, one input and one output"
        )
    if item.needs_labels:
        raise UsageError(
            f"{item.label} runs only given its labels (an encoder-decoder builds its decoder's input from them): it "
            "predicts nothing from its input alone, which a stability study compares; sweep and verify measure it"
        )
    shape, outputs = item.inputs[0].shape, item.outputs[0].shape
    if data.takes == "tokens" and len(shape) != 1:
        raise UsageError(
            f"{item.label} takes {own.shape_text(shape)} inputs; {data.name} holds sequences of "
            f"{data.input_shape[0]} token ids (a model of tokens takes (length,) integer inputs)"
        )
    if data.takes == "images" and _takes_tokens(item):
        raise UsageError(_other_inputs(item.label, "tokens", data.name))
    channels = kinds.image_channels(shape, item.model.api)
    if data.takes == "images" and (len(shape) != len(data.input_shape) or channels != data.input_shape[-1]):
        kind = kinds.native(item.model.api)
        layout = ", as a module takes them channels first" if kind is not None and kind.channels_first else ""
        raise UsageError(
            f"{item.label} takes {own.shape_text(shape)} inputs; {data.name} holds "
            f"{own.shape_text(data.input_shape)} images (the channels must match{layout})"
        )
    if data.takes == "images" and len(outputs) > 1:
        raise UsageError(
            f"{item.label} outputs {own.shape_text(outputs)} scores, a score per class at each position (a "
            f"segmentation model's); {data.name} labels each image once: a stability study trains a classifier of "
            "images, one score per class per image"
        )
    if data.takes == "tokens" and len(outputs) != 2:
        raise UsageError(
            f"{item.label} outputs {own.shape_text(outputs)} scores per sequence; {data.name} labels each position "
            f"with the next of its {data.classes} tokens: a stability study of tokens trains a language model, "
            "(length, vocabulary) scores per sequence"
        )
    scored = kinds.labels_shape(outputs, item.classes_first)
    if data.takes == "tokens" and scored != tuple(data.input_shape):
        raise UsageError(
            f"{item.label} outputs {own.shape_text(outputs)} scores, a score per class at {scored[0]} positions; "
            f"{data.name} labels each of a sequence's {data.input_shape[0]} positions with the next token: a "
            "stability study of tokens trains a model that scores every position it is given"
        )
    if (item.classes or (outputs[-1] if outputs else None)) != data.classes:
        raise UsageError(
            f"{item.label} outputs {own.shape_text(outputs)} scores; {data.name} has {data.classes} classes "
            "(a factory that takes (input_shape, classes) is built for them)"
        )
    return item.model


def load_in_parent(name: str, backend: str) -> datasets.Dataset:
    """The dataset, loaded in detprof's own process to validate it and to score the study.

    CIFAR comes through Keras, which imports its backend with it: the study's own, so that a
    JAX or PyTorch study never loads TensorFlow (``backends.import_keras``).
    """
    if datasets.canonical_name(name) in datasets.CIFAR_ORIGINS:
        backends.import_keras(backend)
    return datasets.load(name)


def write_summary(
    store: ResultsStore,
    config: StudyConfig,
    variants: list[Variant],
    data: datasets.Dataset,
    device: DeviceChoice,
) -> dict[str, Any]:
    planned_ids = {r.run_id for r in plan_runs(variants, config.runs, config.seed)}
    records = [r for r in store.records() if r.get("run_id") in planned_ids]
    ok = [r for r in records if r["status"] == "ok"]
    first = ok[0] if ok else {}
    result = {
        "kind": "stability",
        "model": config.label,
        "dataset": config.dataset,
        "device": device.label,
        "device_info": device.as_record(),
        "backend": config.backend,
        "backend_device": first.get("device_name"),
        "classes": data.classes,
        "train_examples": len(data.x_train),
        "test_examples": len(data.x_test),
        "takes": data.takes,
        "entropy_rate": data.entropy_rate,
        "frequency_entropy": data.frequency_entropy,
        "input_shape": first.get("input_shape"),
        "config": asdict(config),
        "runs_total": len(planned_ids),
        "runs_ok": len(ok),
        "runs_failed": len(records) - len(ok),
        "determinism": {r["mode"]: r["determinism"] for r in ok},
        "software": first.get("software"),
        "tables": {
            "runs": store.write_table(
                "runs", variant_metrics.runs_table(records, config.label, config.dataset, device.label)
            ),
            "curves": store.write_table("curves", variant_metrics.curves_table(records)),
            "per_class": store.write_table("per_class", variant_metrics.per_class_table(records)),
        },
        "variants": [
            variant_metrics.summarize_variant(v, [r for r in records if r["variant"] == v.name], store.dir, data)
            for v in variants
        ],
    }
    if config.own_model is not None:
        result["model_spec"] = config.own_model.as_record()
    safe = json_safe(result)
    store.write_json("summary.json", safe)
    return safe
