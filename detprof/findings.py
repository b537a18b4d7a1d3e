"""An op without a deterministic implementation: a finding about the model, never a crash of detprof.

A framework refuses such an op in deterministic mode with an error that says so in words
(PyTorch: "... does not have a deterministic implementation"; TensorFlow: "Determinism is not
yet supported ..." or "A deterministic GPU implementation of ... is not currently available").
What a user can act on is which op refused, in which of their layers, and what to do instead;
the sweep records it for the model and ``detprof verify`` reports it, both from here.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import detprof.backends as backends
from detprof.errors import first_line

REFUSAL = re.compile(r"determinis", re.IGNORECASE)
OP = r"(?P<op>[\w.:]*\w)"
"""An op's name: dotted or namespaced, never ending on the full stop of the sentence that names it."""
OP_PATTERNS = (
    re.compile(rf"^{OP} does not have a deterministic implementation"),
    re.compile(rf"Determinism is not yet supported (?:in|for) (?:the )?(?:GPU implementation of )?{OP}"),
    re.compile(rf"deterministic (?:GPU )?implementation of {OP}"),
)
"""Where PyTorch, TensorFlow and XLA name the op in their refusal."""
UNSEEDED = re.compile(r"Random ops require a seed")
"""TensorFlow's refusal of a random op drawn without a seed under determinism: the program's to fix (it words it
with "determinism", but no op lacks a deterministic implementation)."""
SEED_ADVICE = "seed the program at its start (keras.utils.set_random_seed(N)), or give --seed N"
PYTHON_ERROR = re.compile(r"^[\w.]+: ")
"""The exception's type that Python prints before its message on a program's stderr."""
MESSAGE_CHARS = 500
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal's colour or bold code, which Keras puts around the framework's message it re-raises."""


@dataclass(frozen=True)
class Finding:
    """What refused to run deterministically, where, and what the user can do."""

    op: str | None
    """The op the framework named; None where its message names none."""
    message: str
    """The framework's own words: the first line of its error."""
    layer: str | None
    """The model's layer that called the op (``layer.name``), where the error passed through one."""
    advice: str

    def line(self) -> str:
        where = f" in layer {self.layer}" if self.layer else ""
        return f"{self.op or 'an op'}{where} has no deterministic implementation: {self.advice}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """A finding as a record holds it; a field a hand-edited record lacks reads as unknown, never a crash."""
        op, layer = data.get("op"), data.get("layer")
        return cls(
            None if op is None else str(op),
            str(data.get("message") or ""),
            None if layer is None else str(layer),
            str(data.get("advice") or ""),
        )


def refuses_determinism(exc: BaseException) -> bool:
    """Whether ``exc`` is the framework refusing an op in deterministic mode (it says so in words)."""
    message = str(exc)
    return bool(REFUSAL.search(message)) and not UNSEEDED.search(message)


def fix_for(reason: str) -> str | None:
    """What a user does about a failed run whose reason is one detprof knows the fix of; None otherwise."""
    return SEED_ADVICE if UNSEEDED.search(reason) else None


def finding_of(exc: BaseException, backend: str) -> Finding:
    """The finding an op's refusal makes: the op and layer read off the error, the backend's advice."""
    line = _refusal_line(exc)
    message = (f"{type(exc).__name__}: {line}" if line else first_line(exc, with_type=True))[:MESSAGE_CHARS]
    return Finding(_op_in(line or ""), message, _layer_of(exc), _advice(backend))


def program_finding(line: str, backend: str) -> Finding:
    """The finding of a program's refusal (``verify --command``), read off the last line of its stderr, where
    Python printed the error: the op, where the framework named it; no layer, which only a traceback in this
    process would show."""
    return Finding(_op_in(PYTHON_ERROR.sub("", line, count=1)), line[:MESSAGE_CHARS], None, _advice(backend))


def _op_in(text: str) -> str | None:
    return next((m["op"] for pattern in OP_PATTERNS if (m := pattern.search(text))), None)


def _advice(backend: str) -> str:
    return backends.get(backend).nondeterministic_op_advice


def _refusal_line(exc: BaseException) -> str | None:
    """The framework's own line that refuses, wherever its error puts it.

    Keras re-raises an error from a layer's ``call`` under a first line of its own ("Exception
    encountered when calling Unpool.call().") with the framework's message after it in bold
    (terminal escapes), and a ``tf.function`` error opens with a stack excerpt (indented lines,
    which may name a file with "determinis" in it): the first unindented line that refuses.
    """
    lines = ANSI_ESCAPE.sub("", str(exc)).splitlines()
    return next((line.strip() for line in lines if line[:1].strip() and REFUSAL.search(line)), None)


def _layer_of(exc: BaseException) -> str | None:
    """The innermost Keras layer (not a model) whose ``call`` the error passed through, by its name; where its own
    traceback names none, the error it was raised from does (Keras re-raises an error of its symbolic build from
    the build, its layers' frames only in the error it caught)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = None
        tb = error.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if _is_layer(owner):
                found = owner.name
            tb = tb.tb_next
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def _is_layer(value: Any) -> bool:
    keras = sys.modules.get("keras")
    if keras is None:
        return False
    return isinstance(value, keras.layers.Layer) and not isinstance(value, keras.Model)
