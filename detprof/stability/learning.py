"""Whether a stability study's models learned: a study that did not says nothing about what determinism buys.

A stability study whose models did not learn says nothing about what determinism buys
(the predictions of an untrained model flip for reasons unrelated to the kernels), so
``learning_of`` flags it and the report leaves it out of every reading and plot. The rule:
the mean test accuracy over all its runs must reach ``chance + max(LEARNED_MARGIN,
min(chance, (1 - chance) / 2))`` with chance = 1 / classes: twice chance for 10 classes
(20%), at least chance + 10 points for many classes (11% for 100), and at most halfway
from chance to perfect, so that binary tasks are held to 75%, not an impossible 100%. A study
of a generated language (``stability --dataset markov``) is held to the language instead: its
mean held-out loss must be closer to the entropy rate (the rules learned) than to the entropy
of the tokens' frequencies (only which tokens are common learned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detprof.formatting import finite

LEARNED_MARGIN = 0.10
LONGER = 3
"""How many times the epochs a study ran its advice to train longer suggests (a nanoGPT-style model of 2 layers that
did not learn the generated language in its default 20 epochs learned it in 60)."""


@dataclass(frozen=True)
class Learning:
    """Whether a stability study's models learned: its mean test ``accuracy`` over every successful run of every
    variant against ``chance`` (1 / classes; None where the study does not say how many) and the accuracy
    ``needed`` (the module's rule); for a generated language, the mean held-out ``loss`` of the same runs against
    its two reference losses, ``entropy_rate`` and ``frequency_entropy`` (``stability.datasets.Dataset``; None for
    other data)."""

    accuracy: float | None
    chance: float | None
    needed: float | None
    loss: float | None = None
    entropy_rate: float | None = None
    frequency_entropy: float | None = None

    @property
    def judged_by_loss(self) -> bool:
        return self.entropy_rate is not None and self.frequency_entropy is not None

    @property
    def learned(self) -> bool | None:
        """None when it cannot be told (no accuracy, or no class count)."""
        if self.judged_by_loss:
            if self.loss is None:
                return None
            return abs(self.loss - self.entropy_rate) < abs(self.loss - self.frequency_entropy)  # type: ignore[operator]
        if self.accuracy is None or self.needed is None:
            return None
        return self.accuracy >= self.needed

    def line(self) -> str:
        """Why a study that did not learn is left out, in one line."""
        if self.judged_by_loss:
            return (
                f"mean held-out loss {self.loss:.2f} nats, nearer the token frequencies' entropy "
                f"({self.frequency_entropy:.2f}) than the language's entropy rate ({self.entropy_rate:.2f})"
            )
        assert self.accuracy is not None and self.chance is not None and self.needed is not None
        return f"mean test accuracy {self.accuracy:.1%}, chance {self.chance:.1%}, learning needs {self.needed:.0%}"


def learned_threshold(chance: float) -> float:
    return chance + max(LEARNED_MARGIN, min(chance, (1 - chance) / 2))


def references_of(summary: Mapping[str, Any]) -> tuple[float, float] | None:
    """A stability summary's generated language's entropy rate and token-frequency entropy, which its loss is
    judged by; None for other data."""
    rate, frequencies = finite(summary.get("entropy_rate")), finite(summary.get("frequency_entropy"))
    return (rate, frequencies) if rate is not None and frequencies is not None else None


def learning_of(
    variants: Sequence[Mapping[str, Any]], classes: Any, references: tuple[float, float] | None = None
) -> Learning:
    """The runs-weighted mean accuracy of a stability summary's variants, against 1 / ``classes``; with a
    generated language's ``references`` (entropy rate, frequency entropy), its mean loss against them."""
    accuracy, loss = _runs_weighted(variants, "accuracy"), _runs_weighted(variants, "cross_entropy")
    rate, frequencies = references if references is not None else (None, None)
    count = int(classes) if isinstance(classes, int | float) and not isinstance(classes, bool) else 0
    if count < 2:
        return Learning(accuracy, None, None, loss, rate, frequencies)
    chance = 1.0 / count
    return Learning(accuracy, chance, learned_threshold(chance), loss, rate, frequencies)


def _runs_weighted(variants: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    total = weight = 0.0
    for v in variants:
        mean = finite((v.get(metric) or {}).get("mean"))
        runs = int(v.get("runs_ok") or 0)
        if mean is not None and runs > 0:
            total += mean * runs
            weight += runs
    return total / weight if weight else None


def train_longer(epochs: int) -> str:
    """The advice to a study whose models did not learn, in the options its command takes."""
    return f"--epochs {epochs * LONGER}, {LONGER}x the {epochs} it ran"
