"""`detprof models`: parameter counts from real built models, cached per Keras version."""

from __future__ import annotations

import importlib.metadata
import json

import keras
import pytest
from parameter_cache import cached_everywhere

from detprof.cli import main
from detprof.models import registry
from detprof.models.command import parameter_counts


@pytest.mark.slow  # builds two Keras models (smallcnn, resnet18)
def test_parameter_counts_are_built_once_and_cached(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    counts = parameter_counts(["smallcnn", "resnet18"], keras.__version__)
    assert counts == {
        "smallcnn": registry.build("smallcnn").count_params(),
        "resnet18": registry.build("resnet18").count_params(),
    }
    cache = json.loads((tmp_path / "detprof" / "model-parameters.json").read_text())
    assert cache[keras.__version__]["smallcnn"] == counts["smallcnn"]
    # A native module is counted on PyTorch's meta device, as many as when built for real, cached apart from
    # Keras' counts (installing transformers leaves those cached).
    (native,) = parameter_counts(["hf_gpt2_tiny"], keras.__version__).values()
    assert native == sum(p.numel() for p in registry.build("hf_gpt2_tiny").parameters())
    cache = json.loads((tmp_path / "detprof" / "model-parameters.json").read_text())
    assert set(cache) == {keras.__version__, f"transformers-{importlib.metadata.version('transformers')}"}

    def refuse(*_args: object) -> None:
        raise AssertionError("cached counts must not rebuild models")

    monkeypatch.setattr(registry, "build", refuse)
    assert parameter_counts(["smallcnn"], keras.__version__) == {"smallcnn": counts["smallcnn"]}


@pytest.mark.slow
def test_models_command_lists_the_paper_models(tmp_path, monkeypatch, capsys) -> None:
    """Every model listed with its input and source; its parameter count is read from the cache (the counts
    themselves are the test above's), so that the listing builds none of the registry's models."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "detprof" / "model-parameters.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(cached_everywhere(list(registry.BUILT_IN), keras.__version__)))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in registry.BUILT_IN:
        assert name in out
    assert "224x224x3" in out and "keras-applications" in out and "medium-cnn" in out
    assert "256 tokens" in out and "8192 (vocabulary)" in out
    assert "hf_gpt2_tiny" in out and "torch.nn.Module" in out and "3x224x224" in out  # native: channels first
    assert "flax_resnet_small" in out and "Flax module" in out
