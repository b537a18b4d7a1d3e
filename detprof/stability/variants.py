"""Noise sources, the named variants that vary them, and the seeds each run gets.

A variant names the sources that differ between its runs; every other source is held at
one fixed seed shared by all variants, so run ``r`` of ``algo`` and run ``r`` of
``algo+impl`` see the same initial weights, data order and augmentations and differ only
in what the variant adds. ``impl`` has no seed: varying it means running with determinism
off, holding it fixed means determinism on. ``bitflip`` held fixed means no flip at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from detprof.determinism import Mode
from detprof.errors import UsageError
from detprof.option_values import comma_separated

SOURCES: tuple[str, ...] = ("init", "shuffle", "augment", "dropout", "impl", "bitflip")
SEEDED_SOURCES: tuple[str, ...] = ("init", "shuffle", "augment", "dropout", "bitflip")
ALGO_SOURCES = frozenset({"init", "shuffle", "augment", "dropout"})

NAMED_VARIANTS: dict[str, frozenset[str]] = {
    "algo+impl": ALGO_SOURCES | {"impl"},
    "algo": ALGO_SOURCES,
    "impl": frozenset({"impl"}),
    "control": frozenset(),
    **{source: frozenset({source}) for source in SOURCES if source != "impl"},
}
DEFAULT_VARIANTS: tuple[str, ...] = ("algo+impl", "algo", "impl", "control")


@dataclass(frozen=True)
class Variant:
    name: str
    varies: frozenset[str]

    @property
    def mode(self) -> Mode:
        return "default" if "impl" in self.varies else "deterministic"

    @property
    def checks_determinism(self) -> bool:
        """With nothing varying, every run must end with the same weights bit for bit."""
        return not self.varies

    def describe(self) -> str:
        varied = ", ".join(s for s in SOURCES if s in self.varies) or "nothing"
        return f"varies {varied}; determinism {'off' if self.mode == 'default' else 'on'}"


def variant(name: str) -> Variant:
    key = name.strip().lower()
    if key not in NAMED_VARIANTS:
        raise UsageError(f"unknown variant {name!r}; valid variants: {', '.join(NAMED_VARIANTS)}")
    return Variant(key, NAMED_VARIANTS[key])


def parse_variants(text: str) -> list[Variant]:
    """``"algo+impl,algo"`` -> variants in the order given, each once."""
    names = comma_separated(text)
    if not names:
        raise UsageError(f"--variants is empty; valid variants: {', '.join(NAMED_VARIANTS)}")
    found: dict[str, Variant] = {}
    for name in names:
        v = variant(name)
        found.setdefault(v.name, v)
    return list(found.values())


@dataclass(frozen=True)
class RunSeeds:
    init: int
    shuffle: int
    augment: int
    dropout: int
    bitflip: int | None

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)


def _seed(base_seed: int, source: str, slot: int) -> int:
    """Slot 0 is the fixed seed; slot r+1 is run r's own seed, independent across sources."""
    sequence = np.random.SeedSequence([base_seed, SOURCES.index(source), slot])
    return int(sequence.generate_state(1, dtype=np.uint32)[0] >> 1)


def run_seeds(v: Variant, run_index: int, base_seed: int = 0) -> RunSeeds:
    def seed_for(source: str) -> int:
        return _seed(base_seed, source, run_index + 1 if source in v.varies else 0)

    return RunSeeds(
        init=seed_for("init"),
        shuffle=seed_for("shuffle"),
        augment=seed_for("augment"),
        dropout=seed_for("dropout"),
        bitflip=seed_for("bitflip") if "bitflip" in v.varies else None,
    )


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    variant: str
    run_index: int
    mode: Mode
    seeds: RunSeeds


def run_id(variant_name: str, run_index: int) -> str:
    return f"{variant_name}-r{run_index:03d}"


def plan_runs(variants: list[Variant], runs: int, base_seed: int = 0) -> list[PlannedRun]:
    """Round-robin over variants, so a study stopped half-way has some runs of each."""
    return [
        PlannedRun(run_id(v.name, r), v.name, r, v.mode, run_seeds(v, r, base_seed))
        for r in range(runs)
        for v in variants
    ]


def one_weight(sizes: Sequence[int], seed: int) -> tuple[int, int, bool]:
    """Which weight ``bitflip`` moves: one uniformly chosen element of weights of ``sizes`` (which of them, its flat
    index) and whether up or down (Summers & Dinneen)."""
    rng = np.random.default_rng(seed)
    total = np.array(sizes)
    flat_index = int(rng.integers(0, total.sum()))
    upward = bool(rng.integers(0, 2))
    which = int(np.searchsorted(np.cumsum(total), flat_index, side="right"))
    return which, flat_index - int(total[:which].sum()), upward
