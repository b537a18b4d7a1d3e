"""``detprof.measure()`` and ``detprof.step()``: the part of a training program that detprof measures.

    import detprof

    with detprof.measure():
        for batch in batches:
            detprof.step()
            train_step(batch)

A program detprof did not write is measured as a whole process unless it says which part is
its training: the steps inside ``measure()``. Each ``step()`` begins a step, which ends at
the next ``step()`` or where the window closes; what runs inside the window before the first
``step()`` (building the model, a first compiled step) is in no step. Wall time is each
step's, and under a tracer only the window is traced, each step marked in the trace the way
detprof's own worker marks its steps (the tracer's ``capture``: the framework's profiler and
its step annotations on a CPU, ``cudaProfilerStart``/``Stop`` and NVTX ranges under nsys), so
per-step time and the kernel tables read the same as for a model.

Under ``detprof verify --command``, ``detprof.fingerprint(name, value)`` inside the window
fingerprints ``value`` (a model's weights, or tensors) in the current step, and the window
writes the fingerprints where the run's spec says when it closes: the runs are compared
tensor by tensor as ``verify`` compares models (``fingerprints``, ``analysis.verification``).

Run outside detprof (no ``program.files.SPEC_ENV``), all three do nothing and cost next to
nothing, so the program runs unchanged; under ``sweep`` (whose spec names no fingerprints
folder) ``fingerprint()`` does nothing either, so it adds nothing to the measured steps. One
window per process: a second ``measure()`` is a mistake that would make the steps of two
windows one measurement, so it raises under detprof.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detprof.profiler.program.files import ProgramSpec, Window, read_spec

if TYPE_CHECKING:
    from detprof.backends import Backend
    from detprof.fingerprints import RunFingerprints
    from detprof.profiler.tracers import Capture


class _MeasuredWindow:
    """The open window: its steps' wall times, the tracer (with the open step's mark) when the run traces, and
    what the program fingerprinted when the run verifies."""

    def __init__(self, spec: ProgramSpec) -> None:
        self.path = Path(spec.window_path)
        self.fingerprints_path = spec.fingerprints_path
        self.fingerprints: RunFingerprints | None = None
        if spec.fingerprints_path is not None:
            import detprof.fingerprints as fingerprints

            self.fingerprints = fingerprints.RunFingerprints()
        self.failure: str | None = None
        self.tracer: Capture | None = None
        if spec.trace_path is not None:
            from detprof.profiler.tracers import TRACERS

            tracer = TRACERS[spec.tracer]
            self.failure = _untraceable(tracer.framework)
            if self.failure is None:
                self.tracer = tracer.capture(spec.trace_path)
        self.step_wall_ns: list[int] = []
        self.step_mark: contextlib.AbstractContextManager[None] | None = None
        self.step_started: int | None = None
        self.started: tuple[float, int] = (0.0, 0)
        self.is_open = False

    def open(self) -> None:
        if self.tracer is not None:
            self.tracer.start()
        self.started = (time.monotonic(), time.perf_counter_ns())
        self.is_open = True

    def next_step(self) -> None:
        self._end_step()
        if self.tracer is not None:
            self.step_mark = self.tracer.step(len(self.step_wall_ns))
            self.step_mark.__enter__()
        self.step_started = time.perf_counter_ns()

    def fingerprint(self, taken: RunFingerprints, name: str, value: Any) -> None:
        """``value``'s fingerprints in the step open now: the one ``step()`` began last, before the first one step 0."""
        import detprof.fingerprints as fingerprints

        step = len(self.step_wall_ns)
        while len(taken.steps) <= step:
            taken.begin_step()
        for tensor, kind, arrays in fingerprints.tensors_of(name, value):
            taken.add(tensor, kind, arrays)

    def _end_step(self) -> None:
        if self.step_started is None:
            return
        self.step_wall_ns.append(time.perf_counter_ns() - self.step_started)
        self.step_started = None
        if self.step_mark is not None:
            self.step_mark.__exit__(None, None, None)
            self.step_mark = None

    def close(self) -> None:
        """End the open step, then the tracer, and write the fingerprints, if any, then the window for detprof.

        The step ends first: what detprof does after it (an import, the tracer's stop, the files) is no step's.
        """
        self._end_step()
        self.is_open = False
        ended = (time.monotonic(), time.perf_counter_ns())
        from detprof.store import atomic_write_json

        if self.tracer is not None:
            self.tracer.stop()
        marked = len(self.step_wall_ns)
        taken = self.fingerprints
        if taken is not None and self.fingerprints_path is not None and any(taken.steps):
            while len(taken.steps) < max(marked, 1):  # every step the window had, fingerprinted in it or not
                taken.begin_step()
            taken.save(Path(self.fingerprints_path))
        steps = self.step_wall_ns if marked else [ended[1] - self.started[1]]
        window = Window(steps, marked, (self.started[0], ended[0]), self.failure)
        atomic_write_json(self.path, window.as_json())


def _untraceable(framework: Backend | None) -> str | None:
    """Why the run's tracer cannot trace this program: its framework's profiler traces a framework it did not load.

    Starting that profiler would load the framework into the program (seconds, and a second
    framework's threads beside the measured steps) to trace nothing.
    """
    if framework is None or framework.loaded():
        return None
    from detprof.backends import loaded as loaded_backends

    loaded = loaded_backends()
    hint = f"sweep it with --backend {loaded[0].name}" if loaded else "sweep it with --tracer none"
    return f"--tracer traces {framework.module}, which the program had not loaded when its window opened: {hint}"


_opened: list[_MeasuredWindow] = []
"""The window this process opened, once it has: one per process."""


@contextlib.contextmanager
def measure() -> Iterator[None]:
    """The program's measured window: its steps (``step()``) are what detprof times and traces."""
    spec = read_spec()
    if spec is None:
        yield
        return
    if _opened:
        raise RuntimeError("detprof.measure() opens one measured window per process, and this one has opened it")
    window = _MeasuredWindow(spec)
    _opened.append(window)
    window.open()
    try:
        yield
    finally:
        window.close()


def step() -> None:
    """Begin the next measured step (ending the one before); outside a window, or outside detprof, nothing."""
    if _opened and _opened[0].is_open:
        _opened[0].next_step()


def fingerprint(name: str, value: Any) -> None:
    """Fingerprint ``value`` as ``name`` in the current step, for ``detprof verify --command`` to compare its runs.

    ``value``: a ``keras.Model`` (each layer's weights), a ``torch.nn.Module`` (its parameters
    and buffers), a mapping of names to values, or one array or tensor of any framework
    (``fingerprints.tensors_of``). Only inside a window of a run that verifies does it do
    anything: outside detprof, outside the window and under ``sweep`` it returns at once.
    """
    window = _opened[0] if _opened else None
    if window is not None and window.is_open and window.fingerprints is not None:
        window.fingerprint(window.fingerprints, name, value)
