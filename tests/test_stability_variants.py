"""Variants, per-run seeds, the run plan and how workers are shared between modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from detprof.errors import InputError, UsageError
from detprof.stability import study, variants
from detprof.stability.variants import SEEDED_SOURCES


def test_named_variants_vary_what_zhuang_et_al_vary() -> None:
    by_name = {v.name: v for v in variants.parse_variants("algo+impl,algo,impl,control,bitflip,init")}
    assert by_name["algo+impl"].varies == {"init", "shuffle", "augment", "dropout", "impl"}
    assert by_name["algo"].varies == {"init", "shuffle", "augment", "dropout"}
    assert by_name["impl"].varies == {"impl"}
    assert by_name["control"].varies == frozenset()
    assert by_name["bitflip"].varies == {"bitflip"}
    assert by_name["init"].varies == {"init"}
    assert [by_name[n].mode for n in ("algo+impl", "algo", "impl", "control")] == [
        "default",
        "deterministic",
        "default",
        "deterministic",
    ]
    assert by_name["control"].checks_determinism and not by_name["impl"].checks_determinism


def test_parse_variants_keeps_order_drops_repeats_and_normalizes() -> None:
    assert [v.name for v in variants.parse_variants(" Control , algo,control ,")] == ["control", "algo"]


@pytest.mark.parametrize("text", ["algo,nope", "", " , "])
def test_parse_variants_refuses_unknown_or_empty(text: str) -> None:
    with pytest.raises(UsageError, match="valid variants: algo\\+impl, algo, impl, control"):
        variants.parse_variants(text)


def test_fixed_sources_share_one_seed_across_runs_and_variants() -> None:
    control = variants.variant("control")
    shuffle_only = variants.variant("shuffle")
    seeds = [variants.run_seeds(control, r) for r in range(4)] + [variants.run_seeds(shuffle_only, 2)]
    assert len({s.init for s in seeds}) == 1
    assert len({s.augment for s in seeds}) == 1
    assert all(s.bitflip is None for s in seeds)
    assert variants.run_seeds(shuffle_only, 2).shuffle != variants.run_seeds(control, 2).shuffle


def test_varying_sources_differ_per_run_and_are_paired_across_variants() -> None:
    algo, algo_impl = variants.variant("algo"), variants.variant("algo+impl")
    seeds = [variants.run_seeds(algo, r) for r in range(10)]
    for source in ("init", "shuffle", "augment", "dropout"):
        assert len({getattr(s, source) for s in seeds}) == 10
    assert [variants.run_seeds(algo_impl, r) for r in range(10)] == seeds
    first = seeds[0]
    assert len({first.init, first.shuffle, first.augment, first.dropout}) == 4


def test_bitflip_seed_only_when_bitflip_varies_and_base_seed_changes_everything() -> None:
    bitflip = variants.variant("bitflip")
    flips = [variants.run_seeds(bitflip, r).bitflip for r in range(5)]
    assert flips == [variants.run_seeds(bitflip, r).bitflip for r in range(5)]  # reproducible
    assert len(set(flips)) == 5
    a = variants.run_seeds(variants.variant("control"), 0, base_seed=0)
    b = variants.run_seeds(variants.variant("control"), 0, base_seed=1)
    assert all(getattr(a, s) != getattr(b, s) for s in SEEDED_SOURCES if s != "bitflip")


def test_plan_runs_round_robin_with_unique_ids() -> None:
    plan = variants.plan_runs(variants.parse_variants("algo,control"), 3)
    assert [p.run_id for p in plan] == [
        "algo-r000",
        "control-r000",
        "algo-r001",
        "control-r001",
        "algo-r002",
        "control-r002",
    ]
    assert {p.mode for p in plan} == {"deterministic"}


@pytest.mark.parametrize(
    ("pending", "jobs", "expected"),
    [
        ({"default": 10, "deterministic": 10}, 2, [{"default": 1, "deterministic": 1}]),
        ({"default": 10, "deterministic": 10}, 1, [{"default": 1}, {"deterministic": 1}]),
        ({"default": 5, "deterministic": 15}, 4, [{"default": 1, "deterministic": 3}]),
        ({"default": 2, "deterministic": 2}, 8, [{"default": 2, "deterministic": 2}]),
        ({"deterministic": 3}, 4, [{"deterministic": 3}]),
        ({"default": 0, "deterministic": 0}, 4, []),
    ],
)
def test_allocate_workers(pending: dict, jobs: int, expected: list) -> None:
    assert study.allocate_workers(pending, jobs) == expected


def test_default_runs_reconciles_the_embedded_default_with_the_protocol() -> None:
    assert study.default_runs("smallcnn", "digits") == 5
    assert study.default_runs("resnet18", "cifar10") == 10
    assert study.default_runs("smallcnn", "synthetic") == 10


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"runs": 1}, UsageError, "--runs must be at least 2"),
        ({"epochs": 0}, UsageError, "--epochs must be at least 1"),
        ({"batch_size": 0}, UsageError, "--batch-size"),
        ({"lr": 0.0}, UsageError, "--lr must be positive"),
        ({"seed": -1}, UsageError, r"--seed must be a whole number from 0 up \(got -1\)"),
        ({"variants": ("algo", "bogus")}, UsageError, "unknown variant 'bogus'"),
        ({"model": "nonesuch"}, UsageError, "unknown model 'nonesuch'"),
        ({"dataset": "mnist"}, UsageError, "unknown dataset 'mnist'"),
        ({"dataset": "npz:/nonexistent/data.npz"}, InputError, "no such file"),
        ({"model": "gpt_tiny"}, UsageError, "gpt_tiny takes tokens and digits holds images: give it --dataset markov"),
        ({"dataset": "markov"}, UsageError, "smallcnn takes images and markov holds tokens: give it an image dataset"),
    ],
)
def test_study_config_validation(changes: dict, error: type, message: str) -> None:
    config = study.StudyConfig(**changes)
    with pytest.raises(error, match=message):
        config.validated()


def test_study_config_validation_canonicalizes_names() -> None:
    config, chosen = study.StudyConfig(model="SmallCNN", dataset="Digits", variants=("Algo", "algo")).validated()
    assert (config.model, config.dataset, config.variants) == ("smallcnn", "digits", ("algo",))
    assert [v.name for v in chosen] == ["algo"]


def test_a_model_of_tokens_studies_the_markov_language_by_default_for_its_epochs(tmp_path: Path) -> None:
    assert (study.default_dataset("gpt_tiny"), study.default_dataset("vit_tiny")) == ("markov", "digits")
    assert (study.default_epochs("markov"), study.default_epochs("digits")) == (study.TOKEN_EPOCHS, 60)
    config, _ = study.StudyConfig(model="moe_tiny", dataset="markov").validated()
    assert (config.model, config.dataset) == ("moe_tiny", "markov")
    # Your own model's dataset and epochs wait for what its inputs are (the study's inspection decides them).
    (tmp_path / "net.py").write_text("def build():\n    pass\n")
    mine = f"{tmp_path / 'net.py'}:build"
    assert (study.default_dataset(mine), study.default_epochs(None)) == (None, None)
    config, _ = study.StudyConfig(model=mine, dataset=None, epochs=None).validated()
    assert (config.dataset, config.epochs) == (None, None)
    config, _ = study.StudyConfig(model="gpt_tiny", dataset=None, epochs=None).validated()
    assert (config.dataset, config.epochs) == ("markov", study.TOKEN_EPOCHS)


def test_a_module_of_tokens_given_images_is_told_the_dataset_it_takes() -> None:
    """A native module of tokens (the registry's hf_gpt2_tiny) on the digits: the registry model's line, not that
    its 32 inputs do not match the images' channels."""
    from detprof.models import kinds, own
    from detprof.stability import datasets

    tokens = own.TensorFacts("input_ids", (32,), "int64")
    item = own.Inspected(
        own.OwnModel(given="hf_gpt2_tiny", kind="factory", label="hf_gpt2_tiny", api=kinds.TORCH.api),
        built_at_input_shape=False,
        inputs=(tokens,),
        outputs=(own.TensorFacts("logits", (32, 64), "float32"),),
        loss=None,
        parameters=28_032,
    )
    said = r"^hf_gpt2_tiny takes tokens and digits holds images: give it --dataset markov"
    with pytest.raises(UsageError, match=said):
        study._checked(item, datasets.load("digits"))
