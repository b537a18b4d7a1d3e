"""Native PyTorch modules as models (``models.torch_modules``): looked at, fed, trained, marked, and refused.

What a worker reports of a module, the step it trains and the ranges that name its modules are checked in this
process (torch's switches left alone); the command lines run end to end through the CLI, their workers real
subprocesses. The module leaderboard of a sweep is ``test_layers_e2e``'s native case.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from attribution_share import typical_unattributed_share

from detprof.analysis.layers import run_parts
from detprof.analysis.study_results import counted_steps
from detprof.backends.base import (
    COMPILED_PART,
    LOSS_PART,
    OPTIMIZER_PART,
    STEP_PARTS,
    TOP_LEVEL_PART,
    layer_range_name,
)
from detprof.cli import main
from detprof.errors import ExitCode, InputError, UsageError
from detprof.models import kinds, own
from detprof.reports.command import render_report
from detprof.store import ResultsStore
from detprof.traces.attribution import layer_of, layer_path
from detprof.traces.parsers.kineto_json import COMPILED_GRAPH_CALL

MODULES = """
import torch
from torch import nn

import detprof


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class Net(nn.Module):
    def __init__(self, channels, classes):
        super().__init__()
        self.stem = nn.Conv2d(channels, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.mix = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50)

    def forward(self, ids):
        return self.out(torch.tanh(self.mix(self.embed(ids))))


class NormedTokens(nn.Module):  # its norm declared before the embedding that its ids go into
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 50)

    def forward(self, ids):
        return self.out(self.norm(self.embed(ids)))


class Queries(nn.Module):  # an image model with a table of learned queries (DETR's): its images enter no embedding
    def __init__(self):
        super().__init__()
        self.queries = nn.Embedding(4, 8)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.stem(x).mean(dim=(2, 3)) + self.queries.weight.mean(dim=0))


class LastScored(nn.Module):  # nanoGPT's contract: given targets every position scored, and the loss; else the last
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 50)

    def forward(self, ids, targets=None):
        x = self.embed(ids)
        if targets is None:
            return self.out(x[:, [-1], :]), None
        logits = self.out(x)
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, 50), targets.view(-1))


class Seq2Seq(nn.Module):  # an encoder-decoder's contract (T5's): its decoder's input comes from its labels
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(32, 50)

    def forward(self, ids, labels=None):
        if labels is None:
            raise ValueError("You have to specify either decoder_input_ids or labels")
        decoder = torch.nn.functional.pad(labels[:, :-1], (1, 0))
        logits = self.out(torch.cat([self.embed(ids), self.embed(decoder)], dim=-1))
        return {"logits": logits, "loss": torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1))}


def net(input_shape, classes):
    return Net(input_shape[0], classes)


def seq2seq():
    return Seq2Seq()


def last_scored():
    return LastScored()


def normed_tokens():
    return NormedTokens()


def bag_of_words():  # the text-classification tutorial's model: its ids go into a bag, one score per class
    return nn.Sequential(nn.EmbeddingBag(50, 16), nn.Linear(16, 4))


def queries():
    return Queries()


class Segmenter(nn.Module):  # a score per class at each pixel, classes first, as PyTorch's cross-entropy takes them
    def __init__(self, channels, classes):
        super().__init__()
        self.down = nn.Conv2d(channels, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, classes, 2, stride=2)

    def forward(self, x):
        return self.up(torch.relu(self.down(x)))


def segmenter(input_shape, classes):
    return Segmenter(input_shape[0], classes)


class Checkpointed(nn.Module):  # activation checkpointing: each block's forward recomputed in the backward pass
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2)])
        self.head = nn.Linear(8, 50)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def checkpointed():
    return Checkpointed()


class Masked(nn.Module):  # a second input beside its ids
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)

    def forward(self, ids, mask):
        return self.embed(ids) * mask.unsqueeze(-1)


def masked():
    return Masked()


class Recurrent(nn.Module):  # an LSTM text classifier: oneDNN has no float16 LSTM on a CPU
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0][:, -1])


def recurrent():
    return Recurrent()


class Tagger(nn.Module):  # a score per class at each position, classes first, as a Conv1d returns them
    def __init__(self, stride=1):
        super().__init__()
        self.embed = nn.Embedding(64, 8)
        self.conv = nn.Conv1d(8, 64, 3, stride=stride, padding=1)

    def forward(self, ids):
        return self.conv(self.embed(ids).transpose(1, 2))


def tagger():
    return Tagger()


def strided_tagger():  # a score per class at every other position
    return Tagger(stride=2)


class Slots(nn.Module):  # a linear layer's scores of 32 classes at 5 slots: classes last, as long as the input is
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 8)
        self.pool = nn.AdaptiveAvgPool1d(5)
        self.head = nn.Linear(8, 32)

    def forward(self, ids):
        return self.head(self.pool(self.embed(ids).transpose(1, 2)).transpose(1, 2))


def slots():
    return Slots()


def grey():
    return Net(1, 4)


def softmaxed():  # a probability per class: it ends in a softmax
    return nn.Sequential(Net(3, 4), nn.Softmax(dim=1))


def features():  # an MLP of 20 features
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))


def vit_64():  # a Hugging Face vision model configured for 64x64 images
    from transformers import ViTConfig, ViTForImageClassification

    sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    return ViTForImageClassification(ViTConfig(image_size=64, patch_size=16, num_labels=3, **sizes))


def tokens():
    return Tokens()


def no_logits():
    return nn.Flatten(0)


class Headless(nn.Module):  # a base model's output, as Hugging Face's BertModel names it: no head, no logits
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)

    def forward(self, ids):
        return {"last_hidden_state": self.embed(ids)}


def headless():
    return Headless()


def sparse():  # an embedding of sparse gradients, which AdamW cannot step
    return nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Linear(8, 50))


def compiled_already():
    return torch.compile(Net(3, 4))


def scripted():
    return torch.jit.script(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()))


def binary(input_shape, classes):  # one score per example, trained with its own loss on targets of 0 and 1
    return detprof.Training(Net(input_shape[0], 1), loss=nn.BCEWithLogitsLoss())


def one_axis():
    return nn.Sequential(Net(3, 1), nn.Flatten(0))


def bfloat16(input_shape, classes):  # cast as a whole, as a loop that trains in bfloat16 casts it
    return Net(input_shape[0], classes).to(torch.bfloat16)


class Unpooled(nn.Module):  # max unpooling scatters into its output: PyTorch has no deterministic one

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        return self.head(self.unpool(*self.pool(x)).mean(dim=(2, 3)))


def unpooled():
    return Unpooled()


def smooth(logits, labels):
    return torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)


def trained(input_shape, classes):
    model = Net(input_shape[0], classes)
    return detprof.Training(model, loss=smooth, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))


def vector_loss():
    return detprof.Training(Net(3, 4), loss=lambda logits, labels: logits.sum(dim=1))


def elsewhere():
    return detprof.Training(Net(3, 4), optimizer=torch.optim.SGD(Net(3, 4).parameters(), lr=0.1))


def as_tuple():
    model = Net(3, 4)
    return model, smooth, torch.optim.SGD(model.parameters(), lr=0.5)
"""
Capture = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("modules")
    (made / "modules.py").write_text(MODULES)
    return made


def described(
    folder: Path, function: str, shape: tuple[int, ...], given: bool = False, images_last: bool = False
) -> own.Inspected:
    from detprof.models import own_build

    model = own.parse(f"{folder / 'modules.py'}:{function}")
    return own.Inspected.from_answer(model, own_build.describe(model, shape, 6, given or images_last, images_last))


def test_a_module_is_described_at_its_own_layout_with_the_classes_its_logits_score(folder: Path) -> None:
    """Without ``--input-shape`` the study's images (HxWxC) reach a factory channels first; with it, as given."""
    item = described(folder, "net", (12, 12, 3))
    assert item.model.api == kinds.TORCH.api and item.built_at_input_shape and not item.compiled
    assert item.inputs[0].shape == (3, 12, 12) and item.inputs[0].dtype == "float32" and item.classes == 6
    assert item.parameters == 3 * 8 * 9 + 8 + 2 * (8 * 8 * 9 + 8 + 16) + 8 * 6 + 6
    assert described(folder, "grey", (1, 10, 10), given=True).inputs[0].shape == (1, 10, 10)
    tokens = described(folder, "tokens", (12, 12, 3))
    assert tokens.inputs[0].shape == (own_tokens_length(),) and tokens.inputs[0].dtype == "int64"
    assert tokens.outputs[0].shape == (own_tokens_length(), 50) and tokens.classes == 50
    own.refuse_synthetic(tokens)  # token ids are what synthetic data gives a module with an embedding first
    own.refuse_synthetic(item)
    assert item.nondeterministic_ops == () and tokens.nondeterministic_ops == ()
    # the kind of input is what the module's input goes into first, not the order its submodules were declared in
    normed = described(folder, "normed_tokens", (12, 12, 3))
    assert normed.inputs[0].shape == (own_tokens_length(),) and normed.inputs[0].dtype == "int64"
    pair = described(folder, "seq2seq", (12, 12, 3))
    assert pair.needs_labels and pair.inputs[0].dtype == "int64" and pair.outputs[0].shape == (own_tokens_length(), 50)
    from detprof.stability import datasets, study

    with pytest.raises(UsageError, match=r"seq2seq runs only given its labels .* sweep and verify measure it"):
        study._checked(pair, datasets.load("markov"))
    bag = described(folder, "bag_of_words", (12, 12, 3))
    assert bag.inputs[0].shape == (own_tokens_length(),) and bag.inputs[0].dtype == "int64" and bag.classes == 4
    with pytest.raises(UsageError, match=r"bag_of_words outputs 4 scores per sequence; markov labels each position"):
        study._checked(bag, datasets.load("markov"))  # a text classifier is no language model
    images = described(folder, "queries", (12, 12, 3))
    assert images.inputs[0].shape == (3, 12, 12) and images.inputs[0].dtype == "float32" and images.classes == 5
    assert described(folder, "bfloat16", (12, 12, 3)).inputs[0].dtype == "bfloat16"  # fed in its weights' dtype
    segments = described(folder, "segmenter", (12, 12, 3))
    assert segments.outputs[0].shape == (6, 12, 12) and segments.classes == 6  # classes first, not the width
    with pytest.raises(UsageError, match=r"segmenter outputs 6x8x8 scores, a score per class at each position"):
        study._checked(described(folder, "segmenter", (8, 8, 1)), datasets.load("digits"))


def test_an_op_without_a_deterministic_implementation_is_named_with_its_module_before_anything_runs(
    folder: Path,
) -> None:
    """One training step under ``warn_only``: each op PyTorch warns of, and the module that called it; the process's
    determinism as it was after."""
    import torch

    item = described(folder, "unpooled", (3, 8, 8), given=True)
    ((found,),) = (item.nondeterministic_ops,)
    assert found["op"] == "max_unpooling2d_forward_out" and found["modules"] == ["unpool"], found
    assert "does not have a deterministic implementation" in found["message"]
    line = own.without_deterministic_implementation(item.label, item.nondeterministic_ops)
    assert line is not None and line.startswith(
        "unpooled: no deterministic implementation on this device for max_unpooling2d_forward_out (in unpool): "
    )
    assert not torch.are_deterministic_algorithms_enabled()


def own_tokens_length() -> int:
    from detprof.models.torch_modules import TOKENS

    return TOKENS


def test_a_module_that_cannot_take_the_batch_or_returns_no_logits_is_one_line(folder: Path) -> None:
    with pytest.raises(UsageError, match=r"forward failed on a batch of 3x4 float32 inputs \(RuntimeError: .*--input"):
        described(folder, "grey", (3, 4), given=True)
    # Without --input-shape, the layer the input reaches first says what to give.
    with pytest.raises(UsageError, match=r"3x12x12 .*: give the --input-shape it takes \(1x12x12: its first layer, a "):
        described(folder, "grey", (12, 12, 3))
    with pytest.raises(UsageError, match=r"3x12x12 .*it takes \(20: its first layer, a Linear, takes 20 features\)$"):
        described(folder, "features", (12, 12, 3))
    with pytest.raises(UsageError, match=r"it takes \(3x64x64: its configuration's num_channels and image_size\)$"):
        described(folder, "vit_64", (12, 12, 3))
    with pytest.raises(UsageError, match=r"no_logits: the module returned Tensor of shape \(8,\), not logits"):
        described(folder, "no_logits", (4,), given=True)
    with pytest.raises(
        UsageError, match=r"it holds last_hidden_state, no logits: give the model with a task head .*, not Headless\)"
    ):
        described(folder, "headless", (4,), given=True)
    with pytest.raises(UsageError, match=r"sparse: its first training step failed \(RuntimeError: Adam does not supp"):
        described(folder, "sparse", (12, 12, 3))
    with pytest.raises(
        UsageError, match=r"one_axis: .* of shape \(2,\), not logits .*keeps its last axis, \(batch, 1\)"
    ):
        described(folder, "one_axis", (8, 8, 3))
    with pytest.raises(UsageError, match=r"the module takes token ids: --input-shape is their length"):
        described(folder, "tokens", (3, 8, 8), given=True)
    with pytest.raises(
        UsageError, match=r"masked: its forward takes 2 inputs \(ids, mask\); detprof feeds a model one"
    ):
        described(folder, "masked", (8, 8, 3))
    # torch.compile's module would carry what one mode compiled into the other: --compile compiles it per process
    with pytest.raises(UsageError, match=r"compiled_already: the function returns a module compiled by torch.compile"):
        described(folder, "compiled_already", (8, 8, 3))
    with pytest.raises(UsageError, match=r"scripted: the function returns a TorchScript module .*: return the module"):
        described(folder, "scripted", (8, 8, 3))
    # A stability study, which has no --input-shape, names the datasets instead: it feeds the module its dataset.
    from detprof.models import own_build
    from detprof.stability import datasets, study

    synthetic = datasets.load("synthetic")
    grey = own.parse(f"{folder / 'modules.py'}:grey").as_record()
    fed = (
        r"forward failed on a batch of 3x16x16 float32 inputs \(RuntimeError: .*\): a stability study feeds it "
        r"synthetic \(16x16x3 images, HxWxC; channels first to a PyTorch module\): give a --dataset it takes "
        r"\(images: digits 8x8x1, synthetic 16x16x3, cifar10 32x32x3, cifar100 32x32x3; token ids: markov\) or npz"
    )
    with pytest.raises(UsageError, match=fed):
        own_build.inspect([grey], "torch", list(synthetic.input_shape), 10, fed=study.fed_instead(synthetic))


def spec(folder: Path, function: str, shape: list[int], classes: int) -> dict[str, object]:
    model = own.parse(f"{folder / 'modules.py'}:{function}")
    record = model.as_record() | {"api": kinds.TORCH.api}
    return {"model": function, "own_model": record, "input_shape": shape, "classes": classes, "batch_size": 4}


@pytest.mark.slow  # compiles the module in each of its four runs
def test_verify_compile_trains_the_module_through_torch_compile_each_run_compiling_it_itself(
    folder: Path, tmp_path: Path, capsys: Capture
) -> None:
    """``verify --compile``: each run trains the module through torch.compile with PyTorch's compiler caches off in
    its own process (two runs that loaded one compiled graph could not part in what compiling chose). No hook inside
    the compiled graph (it would be compiled in): the module's logits stand for its submodules' outputs, then its
    gradients and every module's weights; the two runs of each mode are bitwise identical on this CPU."""
    from detprof.fingerprints import RunFingerprints

    out = tmp_path / "out"
    args = ["verify", "--models", f"{folder / 'modules.py'}:net", "--backend", "torch", "--compile", "--steps", "2"]
    sizes = ["--input-shape", "3x8x8", "--classes", "5", "--batch-size", "4"]
    code = main([*args, "--gradients", *sizes, "--out", str(out)])
    said = capsys.readouterr()
    assert code == ExitCode.OK, said.out + said.err
    assert "2 runs of 2 steps, compiled on cpu (torch)" in said.err
    records = list(ResultsStore(out, "verify").records())
    assert len(records) == 4
    for record in records:
        assert record["status"] == "ok" and record["settings"]["compile"] is True
        assert record["compilation_cache"] == "off"
        assert record["settings"]["inductor_deterministic"] is (record["mode"] == "deterministic")
    taken = RunFingerprints.load(next((out / "verify" / "fingerprints").glob("net--deterministic--a*")))
    first = taken.steps[0]
    assert [f.name for f in first if f.kind == "output"] == ["Net"]
    assert {f.name for f in first if f.kind == "weights"} >= {"stem", "blocks.0.conv", "head"}
    assert any(f.kind == "gradients" for f in first)
    page = render_report([out], "md")
    assert "PyTorch's compiler caches (Inductor's) off in its process" in page
    (verified,) = json.loads(render_report([out], "json"))["verification"]
    assert verified["compiled"] is True and verified["compilation_cache"] == "off" and verified["held"] is True


def test_a_compiled_module_compiles_its_graphs_in_its_process_to_place_their_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A graph Inductor loaded from its cache would not be compiled in the process, its kernels placed in no module:
    a study whose first repeat compiled and whose next loaded would place one kernel two ways."""
    import torch
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.graph import GraphLowering

    from detprof.backends.torch import compiled

    monkeypatch.setattr(GraphLowering, "compile_to_module", GraphLowering.compile_to_module)
    monkeypatch.setattr(torch._inductor.config.trace, "provenance_tracking_level", 0)
    monkeypatch.setattr(torch._inductor.config.cpp, "enable_kernel_profile", False)
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", True)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", True)
    compiled(torch.nn.Linear(2, 2), "inductor")
    assert not torch._inductor.config.fx_graph_cache and not torch._functorch.config.enable_autograd_cache
    assert torch._inductor.config.trace.provenance_tracking_level == 1


def test_each_arm_builds_the_same_module_and_a_step_trains_it_as_users_do(folder: Path) -> None:
    import torch

    from detprof.models.own_build import native_training
    from detprof.models.torch_modules import batch

    first, second = (native_training(spec(folder, "net", [3, 8, 8], 5), seed=3) for _ in range(2))
    weights = [p.detach().clone() for p in first.module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(weights, second.module.parameters(), strict=True))
    first.step()()
    assert not all(torch.equal(a, b) for a, b in zip(weights, first.module.parameters(), strict=True))
    facts = first.facts()
    assert facts["model_api"] == "torch" and facts["classes"] == 5 and facts["input_shape"] == [3, 8, 8]
    assert facts["layer_names"][:4] == ["stem", "blocks", "blocks.0", "blocks.0.conv"]
    tokens = native_training(spec(folder, "tokens", [6], 50), seed=3)
    assert tokens.x.dtype == torch.int64 and tokens.y.shape == (4, 6) and int(tokens.x.max()) < 50
    tokens.step()()
    assert tokens.labels_keyword is None and not tokens.targets
    # a loss that takes targets shaped as the logits (BCE) is given 0s and 1s, not class ids, in each batch drawn
    binary = native_training(spec(folder, "binary", [3, 8, 8], 10), seed=3)
    assert binary.targets and binary.y.dtype == torch.float32 and binary.y.shape == (4, 1)
    assert set(binary.y.flatten().tolist()) <= {0.0, 1.0}
    assert torch.equal(batch(binary.module, spec(folder, "binary", [3, 8, 8], 10), 3, (1,), True)[1], binary.y)
    binary.step()()
    item = described(folder, "binary", (8, 8, 3))
    assert item.targets and item.classes == 1
    own.refuse_synthetic(item)  # one score per example is not refused: its loss takes the targets synthetic data has
    assert tokens.facts()["train_step"].endswith("cross-entropy, backward, AdamW.step")
    # a module that computes its own loss given its targets (nanoGPT) trains on it, every position scored
    last = native_training(spec(folder, "last_scored", [6], 50), seed=3)
    assert last.own_loss and last.labels_keyword == "targets"
    assert last.logits_shape == (6, 50) and last.y.shape == (4, 6)
    assert last.facts()["train_step"] == "eager PyTorch: forward, its own loss, backward, AdamW.step"
    loss, logits = last.train_on(last.x, last.y)
    assert loss.ndim == 0 and logits.shape == (4, 6, 50)
    # an encoder-decoder runs only given its labels: it trains on its own loss, given them
    pair = native_training(spec(folder, "seq2seq", [6], 50), seed=3)
    assert pair.own_loss and pair.needs_labels and pair.labels_keyword == "labels" and pair.logits_shape == (6, 50)
    pair.step()()
    # a segmentation model trains on cross-entropy at each pixel, its logits classes first as its loop passes them
    segments = native_training(spec(folder, "segmenter", [3, 8, 8], 5), seed=3)
    assert segments.classes == 5 and segments.logits_shape == (5, 8, 8) and segments.y.shape == (4, 8, 8)
    assert int(segments.y.max()) == 4
    logits = segments.logits(segments.x)
    expected = torch.nn.functional.cross_entropy(logits, segments.y)
    assert torch.equal(segments.loss_of(segments.x, segments.y), expected)
    segments.step()()


def test_a_module_returned_with_its_loss_and_optimizer_trains_with_them(folder: Path) -> None:
    """``detprof.Training``: the step is the user's loss and optimizer, checked against the same step written by
    hand; a loss that is not a scalar, an optimizer over another module's parameters, or the three returned as a
    tuple, is one line."""
    import torch

    from detprof.models.own_build import native_training

    item = described(folder, "trained", (8, 8, 3))
    assert item.model.api == kinds.TORCH.api and item.inputs[0].shape == (3, 8, 8) and item.classes == 6
    training, reference = (native_training(spec(folder, "trained", [3, 8, 8], 5), seed=3) for _ in range(2))
    assert training.facts()["train_step"] == "eager PyTorch: forward, smooth, backward, SGD.step"
    training.step()()
    logits = reference.module(reference.x)
    torch.nn.functional.cross_entropy(logits, reference.y, label_smoothing=0.1).backward()
    with torch.no_grad():
        expected = [p - 0.5 * p.grad for p in reference.module.parameters()]
    assert all(torch.allclose(a, b) for a, b in zip(training.module.parameters(), expected, strict=True))
    with pytest.raises(UsageError, match=r"vector_loss: the loss \(<lambda>\) returned \[2\], not a scalar"):
        described(folder, "vector_loss", (3, 8, 8), given=True)
    with pytest.raises(UsageError, match=r"elsewhere: detprof.Training's optimizer updates none of the module's"):
        described(folder, "elsewhere", (3, 8, 8), given=True)
    with pytest.raises(
        UsageError, match=r"as_tuple returned a tuple \(Net, function, SGD\): return the module alone, or"
    ):
        described(folder, "as_tuple", (3, 8, 8), given=True)


@pytest.mark.parametrize(("amp", "dtype"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_with_amp_the_forward_pass_and_the_loss_run_in_half_precision_and_the_weights_stay_float32(
    folder: Path, amp: str, dtype: str
) -> None:
    """``--amp``: the forward pass and the loss under ``torch.autocast``, the backward pass and the update outside
    it, as users write it; float16's loss scaled by a ``GradScaler`` (its scale in effect after the step); the record
    says so."""
    import torch

    from detprof.models.own_build import native_training

    training = native_training(spec(folder, "net", [3, 8, 8], 5) | {"amp": amp}, seed=0)
    seen: list[torch.dtype] = []
    handle = training.module.head.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    try:
        training.step()()
    finally:
        handle.remove()
    assert seen == [getattr(torch, dtype)]
    assert {p.dtype for p in training.module.parameters()} == {torch.float32}
    scaled = amp == "fp16"
    assert (training.scaler is not None and training.scaler.get_scale() == 2.0**16) is scaled
    assert training.facts()["dtype_policy"] == f"float32 weights, {dtype} autocast" + (", loss scaled" * scaled)
    assert native_training(spec(folder, "net", [3, 8, 8], 5), seed=0).facts()["dtype_policy"] == "float32"


def test_a_frame_taggers_line_of_scores_is_read_classes_first_and_a_stability_study_reads_them_last(
    folder: Path,
) -> None:
    """A Conv1d tagger's logits (classes x length, as PyTorch's cross-entropy takes them) score its 64 classes, not
    its input's length: trained against a class id per position, and read classes last where a stability study takes
    its predictions. A language model's (length x vocabulary) keep theirs last."""
    import torch

    from detprof.models.own_build import native_training
    from detprof.stability import datasets, study
    from detprof.stability.module_training import ModuleTrainer
    from detprof.stability.variants import RunSeeds

    length = own_tokens_length()
    item = described(folder, "tagger", (12, 12, 3))
    assert item.inputs[0].shape == (length,) and item.outputs[0].shape == (64, length) and item.classes == 64
    training = native_training(spec(folder, "tagger", [length], 64), seed=0)
    assert training.y.shape == (4, length) and int(training.y.max()) < 64
    logits, loss = training.logits_and_loss(training.x, training.y)
    assert torch.equal(loss, torch.nn.functional.cross_entropy(logits, training.y))
    assert training.classes_last(logits).shape == (4, length, 64)
    language = native_training(spec(folder, "tokens", [length], 50), seed=0)
    assert language.y.shape == (4, length) and language.classes == 50
    assert training.facts()["labels_shape"] == language.facts()["labels_shape"] == [length]  # the report reads it
    assert training.facts()["input_dtype"] == "int64"
    markov = datasets.load("markov")
    checked = study._checked(described(folder, "tagger", markov.input_shape), markov)  # as a study inspects it
    trainer = ModuleTrainer(checked, markov.input_shape, markov.takes, markov.classes, 1e-3)
    trainer.reset(RunSeeds(init=0, shuffle=0, augment=0, dropout=0, bitflip=None))
    _, right = trainer.train_step(markov.x_train[:4], markov.y_train[:4])
    assert 0 <= right <= 4 * datasets.MARKOV_LENGTH
    _, scores = trainer.infer(markov.x_test[:4], 4)
    assert scores.shape == (4, datasets.MARKOV_LENGTH, 64)
    # The layer that makes the logits says where their classes are, whatever their lengths: a strided Conv1d's 16
    # frames of 32 tokens come classes first, a linear layer's 32 classes at 5 slots last.
    strided = described(folder, "strided_tagger", (12, 12, 3))
    assert strided.outputs[0].shape == (64, length // 2) and strided.classes == 64
    training = native_training(spec(folder, "strided_tagger", [length], 64), seed=0)
    assert training.y.shape == (4, length // 2) and training.classes_last(training.logits(training.x)).shape[-1] == 64
    logits, loss = training.logits_and_loss(training.x, training.y)
    assert torch.equal(loss, torch.nn.functional.cross_entropy(logits, training.y))
    assert length == 32 and described(folder, "slots", (12, 12, 3)).classes == 32
    assert native_training(spec(folder, "slots", [length], 32), seed=0).y.shape == (4, 5)
    with pytest.raises(UsageError, match=r"a score per class at 8 positions; markov labels each of a sequence's 16 "):
        study._checked(described(folder, "strided_tagger", markov.input_shape), markov)


def test_a_module_that_ends_in_a_softmax_trains_on_the_cross_entropy_of_its_probabilities(folder: Path) -> None:
    """Its output is read as probabilities (non-negative, summing to 1 per example), as Keras reads a model's: the
    cross-entropy takes their log, the loss of the logits before the softmax, not a softmax of them again; a
    stability study reads them as probabilities too."""
    import torch

    from detprof.models.own_build import native_training

    training = native_training(spec(folder, "softmaxed", [3, 8, 8], 4), seed=0)
    assert (
        training.probabilities
        and "forward, cross-entropy on its probabilities, backward" in training.facts()["train_step"]
    )
    _, loss = training.logits_and_loss(training.x, training.y)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(training.module[0](training.x), training.y)
    assert torch.allclose(loss, expected, atol=1e-6)
    logits = native_training(spec(folder, "net", [3, 8, 8], 4), seed=0)
    assert not logits.probabilities and "forward, cross-entropy, backward" in logits.facts()["train_step"]
    from detprof.stability.module_training import ModuleTrainer
    from detprof.stability.variants import RunSeeds

    model = own.parse(f"{folder / 'modules.py'}:softmaxed")
    trainer = ModuleTrainer(replace(model, api=kinds.TORCH.api), (8, 8, 3), "images", 4, 1e-3)
    trainer.reset(RunSeeds(init=0, shuffle=0, augment=0, dropout=0, bitflip=None))
    assert trainer.outputs_probabilities


def test_a_module_that_fails_to_train_in_the_precision_amp_asks_is_refused_in_one_line_before_any_run(
    folder: Path,
) -> None:
    """An LSTM under float16 autocast on a CPU (oneDNN has none): its float32 probe passes, and every run would
    fail; the inspection trains it a step under ``--amp`` first. In bfloat16 it trains."""
    from detprof.models import own_build
    from detprof.models.plans import ModelsAsked, model_plans

    def in_process(entry: str, request: dict[str, Any], what: str) -> Any:
        return own_build.inspect(**request)

    model = f"{folder / 'modules.py'}:recurrent"
    (plan,) = model_plans(ModelsAsked((model,), 4, amp="bf16"), "torch", in_process)
    assert plan.classes == 4
    with pytest.raises(UsageError) as refused:
        model_plans(ModelsAsked((model,), 4, amp="fp16"), "torch", in_process)
    said = str(refused.value)
    assert said.startswith(f"{model}: a training step fails under --amp fp16 on the cpu (RuntimeError: ")
    assert said.endswith("): train it without --amp, or with --amp bf16") and "\n" not in said


def test_the_tracer_names_each_module_call_by_its_path_and_the_loss_and_update_apart(folder: Path) -> None:
    import torch

    from detprof.backends.torch import _mark_layers
    from detprof.models.own_build import native_training

    training = native_training(spec(folder, "net", [3, 8, 8], 5), seed=0)
    step = training.step()
    unmark = _mark_layers(torch.profiler.record_function)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            step()
    finally:
        unmark()
    names = {event.name for event in profile.events()}
    paths = ["stem", "blocks", "blocks.0", "blocks.0.conv", "blocks.1.norm", "head", LOSS_PART, OPTIMIZER_PART]
    assert {layer_range_name(path) for path in paths} <= names
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as after:
        step()
    assert not any(event.name.startswith(layer_range_name("")) for event in after.events())


def test_a_modules_range_ends_where_activation_checkpointing_stops_its_recomputed_forward(folder: Path) -> None:
    """Checkpointing recomputes a block's forward in the backward pass and stops it once the backward has what it
    needs: its inner module's range ends there too, so that no range holds the ones after it (the loss, the update,
    the next step's modules)."""
    import contextlib

    import torch.utils.checkpoint  # noqa: F401

    from detprof.backends.torch import _mark_layers
    from detprof.models.own_build import native_training

    open_ranges: list[str] = []
    around_update: list[list[str]] = []

    @contextlib.contextmanager
    def range_named(name: str) -> Iterator[None]:
        open_ranges.append(name)
        if name == layer_range_name(OPTIMIZER_PART):
            around_update.append(list(open_ranges))
        try:
            yield
        finally:
            open_ranges.pop()

    training = native_training(spec(folder, "checkpointed", [6], 50), seed=0)
    step = training.step()
    unmark = _mark_layers(range_named)
    try:
        for _ in range(2):
            step()
    finally:
        unmark()
    assert open_ranges == [] and around_update == [[layer_range_name(OPTIMIZER_PART)]] * 2


def test_a_modules_path_stands_for_its_parents_ranges() -> None:
    layers = ["blocks", "blocks.1", "blocks.1.conv", "head"]
    assert layer_of("net/blocks/blocks.1/blocks.1.conv", layers) == "blocks.1.conv"
    assert layer_of("net/blocks/blocks.1", layers) == "blocks.1"
    assert layer_of("net/head", layers) == "head"
    assert layer_path("blocks/blocks.1/blocks.1.conv", ranges_only=True) == "blocks.1.conv"
    # Keras paths are as they were: a sublayer's own name after its layer's.
    assert layer_of("mha_1/value", ["mha_1", "value"]) == "mha_1/value"
    # A compiled region is a row where no module's range inside it places the op.
    assert layer_of(COMPILED_PART, layers) == COMPILED_PART
    assert layer_of(f"{COMPILED_PART}/blocks/blocks.1", layers) == "blocks.1"
    # So is the module's own call, for what it runs outside every submodule; the innermost such part holds the op.
    assert layer_of(f"{TOP_LEVEL_PART}/blocks/blocks.1", layers) == "blocks.1"
    assert layer_of(f"{TOP_LEVEL_PART}/relu", layers) == TOP_LEVEL_PART
    assert layer_of(f"{TOP_LEVEL_PART}/{COMPILED_PART}/add", layers) == COMPILED_PART
    assert layer_of(f"jit(train_step)/transpose(jvp({TOP_LEVEL_PART}))/blocks.1/conv", layers) == "blocks.1"
    assert layer_of(f"{TOP_LEVEL_PART}/{LOSS_PART}/mul", layers) == LOSS_PART


@pytest.mark.slow
def test_a_module_implies_pytorch_and_another_backend_or_command_is_one_line(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Without ``--backend`` a sweep of a module plans PyTorch, ``--compile`` (torch.compile, which the installed
    default, TensorFlow, lacks) included; with another backend, or beside a Flax model, it is refused in one line
    before anything runs."""
    monkeypatch.chdir(folder)
    assert main(["sweep", "--models", "modules.py:net,modules.py:unpooled", "--compile", "--dry-run"]) == ExitCode.OK
    plan = capsys.readouterr().out
    assert re.search(r"^  compiler +torch\.compile pinned: on in both modes \(--compile\)$", plan, re.M), plan
    assert re.search(
        r"^  backend +torch \(what a torch\.nn\.Module trains on; its workers load no Keras\)$", plan, re.M
    )
    warned = r"^unpooled: no deterministic implementation on this device for max_unpooling2d_forward_out \(in unpool\)"
    assert re.search(warned, plan, re.MULTILINE), plan
    refused = [
        (
            ["sweep", "--models", "modules.py:net", "--backend", "jax", "--dry-run"],
            "which trains on PyTorch, not on jax",
        ),
        (  # a module and a Flax model each imply their own backend: no --backend serves both
            ["verify", "--models", "hf_gpt2_tiny,flax_gpt_tiny"],
            "hf_gpt2_tiny is a torch.nn.Module, which trains on PyTorch, and flax_gpt_tiny a Flax module, which "
            "trains on JAX: a study runs on one backend: give them to two",
        ),
    ]
    assert_refused_in_one_line(refused, folder / "none", capsys)


INSPECTED_IN_TURN = """
import json
import sys

from detprof.models import own
from detprof.models.own_build import inspect

seen = []
for given in sys.argv[1:]:
    (answer,) = inspect([own.parse(given).as_record()], "tensorflow", [12, 12, 3], 6)
    seen.append([answer["api"], sorted(name for name in ("keras", "tensorflow") if name in sys.modules)])
print(json.dumps(seen))
"""
"""A module, then a Keras model, inspected in one process as the worker of the installed default (TensorFlow)
inspects them: what each was found to be, and which of Keras and TensorFlow the process had loaded after it."""


@pytest.mark.slow
def test_a_modules_inspection_loads_no_keras_or_tensorflow_until_a_keras_model_imports_them(
    folder: Path, tmp_path: Path
) -> None:
    """Without ``--backend`` the parent knows a model file's kind only once a worker has looked, and names the
    installed default, TensorFlow: that worker loads Keras and TensorFlow only when the model's code imports them,
    so a module's inspection loads neither, and a Keras model's after it finds both loaded on TensorFlow."""
    (tmp_path / "keras_net.py").write_text(
        "import keras\n\n\ndef build(input_shape, classes):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(classes)])\n"
    )
    given = [str(folder / "modules.py") + ":net", str(tmp_path / "keras_net.py") + ":build"]
    done = subprocess.run([sys.executable, "-c", INSPECTED_IN_TURN, *given], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [["torch", []], ["keras", ["keras", "tensorflow"]]]


def assert_refused_in_one_line(refused: list[tuple[list[str], str]], out: Path, capsys: Capture) -> None:
    """Each command exits 2 with one line holding its words, before anything is written to ``out``."""
    for args, words in refused:
        assert main([*args, "--out", str(out)]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert err.startswith("detprof: error: ") and words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_data_in_the_modules_own_layout_feeds_it(folder: Path, capsys: Capture) -> None:
    """``--data``'s arrays as the module takes them (channels first): checked against the module in the parent,
    its leading rows the worker's batch."""
    import numpy as np
    import torch

    from detprof.models.npz_data import headers
    from detprof.models.own_build import native_training

    rng = np.random.default_rng(0)
    path = folder / "grey.npz"
    np.savez(path, x_train=rng.integers(0, 256, (8, 1, 10, 10), dtype=np.uint8), y_train=np.arange(8) % 4)
    item = described(folder, "grey", (1, 10, 10), given=True)
    feed = own.data_feed(item, path, headers(path), 4)
    with pytest.raises(InputError, match=r"array x_train holds 1x10x10 examples; grey's input takes 1x12x12"):
        own.data_feed(described(folder, "grey", (1, 12, 12), given=True), path, headers(path), 4)
    # Labels stored as floats train as the whole numbers they hold; one that is not is refused, not cut to a class.
    whole, cut = folder / "whole.npz", folder / "cut.npz"
    np.savez(whole, x_train=rng.random((8, 1, 10, 10), dtype=np.float32), y_train=(np.arange(8) % 4).astype(float))
    np.savez(cut, x_train=rng.random((8, 1, 10, 10), dtype=np.float32), y_train=np.linspace(0, 0.9, 8))
    assert own.data_feed(item, whole, headers(whole), 4)["targets"] == [["logits", "y_train"]]
    with pytest.raises(InputError, match=r"array y_train holds labels that are not whole numbers \(such as 0.128571"):
        own.data_feed(item, cut, headers(cut), 4)
    # One-hot labels (or probabilities), a row of the four classes' per example, would be read as four ids each.
    for hot in (np.eye(4)[np.arange(8) % 4], np.full((8, 4), 0.25, dtype=np.float32)):
        np.savez(cut, x_train=rng.random((8, 1, 10, 10), dtype=np.float32), y_train=hot)
        with pytest.raises(
            InputError, match=r"y_train holds one-hot labels \(4 per example, summing to 1\): grey trai"
        ):
            own.data_feed(item, cut, headers(cut), 4)
    np.savez(cut, x_train=rng.random((8, 1, 10, 10), dtype=np.float32), y_train=np.arange(32).reshape(8, 4) % 4)
    assert own.data_feed(item, cut, headers(cut), 4)["targets"] == [["logits", "y_train"]]  # rows of ids: no one-hot
    with pytest.raises(InputError, match=r"no array 'input' or 'x_train' for grey's input \(it holds y_train\)"):
        np.savez(folder / "labels.npz", y_train=np.arange(8))
        own.data_feed(item, folder / "labels.npz", headers(folder / "labels.npz"), 4)
    params = spec(folder, "grey", [1, 10, 10], 4) | {"data": feed}
    training = native_training(params, seed=0)
    assert training.x.shape == (4, 1, 10, 10) and float(training.x.max()) <= 1.0 and training.x.dtype == torch.float32
    assert training.y.tolist() == [0, 1, 2, 3]
    training.step()()
    # Without --input-shape, a sweep plans the module at --data's examples as stored, or, stored channels last (the
    # layout stability's npz takes too), moved channels first: the same batch either way. Examples it cannot take
    # are refused in one line that says how to store them.
    first, last = folder / "first.npz", folder / "last.npz"
    rgb = rng.integers(0, 256, (8, 3, 10, 10), dtype=np.uint8)
    np.savez(first, x_train=rgb, y_train=np.arange(8) % 4)
    np.savez(last, x_train=rgb.transpose(0, 2, 3, 1), y_train=np.arange(8) % 4)
    for function, data, code in (
        ("net", last, ExitCode.OK),
        ("grey", path, ExitCode.OK),
        ("grey", last, ExitCode.USAGE),
    ):
        args = ["sweep", "--models", f"{folder / 'modules.py'}:{function}", "--data", f"npz:{data}", "--dry-run"]
        assert main([*args, "--batch-size", "4", "--out", str(folder / "planned")]) == code, (function, data)
    assert "store --data's x_train as it takes them (images NxHxWxC, moved channels first" in capsys.readouterr().err
    rgb_net = described(folder, "net", (10, 10, 3), images_last=True)
    assert rgb_net.inputs[0].shape == (3, 10, 10)
    fed = [
        native_training(spec(folder, "net", [3, 10, 10], 4) | {"data": own.data_feed(rgb_net, at, headers(at), 4)}, 0)
        for at in (first, last)
    ]
    assert torch.equal(fed[0].x, fed[1].x)


NATIVE_REGISTRY = {
    "hf_resnet50_tiny": {
        "resnet.embedder.embedder.convolution",
        "resnet.encoder.stages.3.layers.2.layer.2.convolution",
    },
    "hf_vit_tiny": {"vit.embeddings.patch_embeddings.projection", "vit.layers.1.mlp.fc2", "classifier"},
    "hf_gpt2_tiny": {"transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "lm_head"},
    "hf_llama_tiny": {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head"},
}
"""The native registry models at their tiny size, and modules of each that do work of their own, by their paths."""


@pytest.mark.slow
def test_the_native_registry_models_train_on_pytorch_with_their_modules_on_the_leaderboard(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hugging Face's ResNet-50, ViT, GPT-2 and Llama-style decoder, built from their configurations: without
    ``--backend`` they train on PyTorch, loading no Keras, on the loss each computes itself (a row of its own), each
    module a leaderboard row by its path, and what no
    module claims under 5% of the step (0.05-0.8% here), eager and in bfloat16 mixed precision (``--amp bf16``).
    Under ``--compile`` (GPT-2 here) the compiled module is a row of its own beside the loss and the update,
    Inductor's fused kernels named in the kernel table and placed in GPT-2's modules, its deterministic mode read
    back per run. With another backend, for a stability study or with another ``--amp``, they are refused in one
    line before any worker starts."""
    out, amp, compiled = tmp_path / "out", tmp_path / "amp", tmp_path / "compiled"
    args = ["sweep", "--steps", "3", "--warmup", "1", "--repeats", "1", "--precision", "off", "--no-report"]
    assert main([*args, "--models", ",".join(NATIVE_REGISTRY), "--out", str(out)]) == ExitCode.OK
    assert main([*args, "--models", "hf_llama_tiny", "--amp", "bf16", "--out", str(amp)]) == ExitCode.OK
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    assert main([*args, "--models", "hf_gpt2_tiny", "--compile", "--out", str(compiled)]) == ExitCode.OK
    capsys.readouterr()
    assert_compiled(compiled)
    mixed = list(ResultsStore(amp, "sweep").records())
    assert {r["dtype_policy"] for r in mixed} == {"float32 weights, bfloat16 autocast"} and len(mixed) == 2
    assert "\nTrained in float32 weights, bfloat16 autocast: hf\\_llama\\_tiny.\n" in render_report([amp], "md")
    records = list(ResultsStore(out, "sweep").records())
    assert {(r["model"], r["mode"], r["status"], r["model_api"], r["backend"]) for r in records} == {
        (model, mode, "ok", "torch", "torch") for model in NATIVE_REGISTRY for mode in ("default", "deterministic")
    }
    assert not any("keras" in r["versions"] for r in records)
    # At the CPU preset's input size, 32: images channels first, as many tokens.
    assert {r["model"]: r["input_shape"] for r in records} == {
        "hf_resnet50_tiny": [3, 32, 32],
        "hf_vit_tiny": [3, 32, 32],
        "hf_gpt2_tiny": [32],
        "hf_llama_tiny": [32],
    }
    assert {r["dtype_policy"] for r in records} == {"float32"}
    assert "\nBackend: torch (PyTorch " in render_report([out], "md")  # no Keras ran them
    # Each trains on the loss it computes itself given the labels, ranged as the step's loss.
    assert all(re.search(r"forward, its own loss \(For\w+Loss\), backward", r["train_step"]) for r in records)
    swept = [
        (folder, model) for folder in (out, amp) for model in json.loads(render_report([folder], "json"))["models"]
    ]
    assert len(swept) == 5
    for at, model in swept:
        layers = {layer["name"]: layer for layer in model["layers"]}
        assert NATIVE_REGISTRY[model["model"]] | set(STEP_PARTS) <= set(layers), sorted(layers)
        assert all(layers[name]["default_ms"] > 0 for name in NATIVE_REGISTRY[model["model"]]), model["model"]
        share = typical_unattributed_share(at, model["model"])
        assert share < 0.05, (model["model"], share, model["unattributed_share"])
    refused = [
        (["sweep", "--models", "hf_gpt2_tiny", "--backend", "jax"], "which trains on PyTorch, not on jax"),
        (["stability", "--model", "hf_llama_tiny", "--backend", "jax"], "which trains on PyTorch, not on jax"),
        (["sweep", "--models", "hf_vit_tiny", "--amp", "fp8"], "--amp takes bf16 or fp16, not 'fp8'"),
    ]
    assert_refused_in_one_line(refused, tmp_path / "none", capsys)


@pytest.mark.slow
def test_a_stability_study_of_a_registry_module_holds_control_bitwise_and_dropout_parts_it(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Hugging Face's GPT-2 on the Markov language (PyTorch implied for the registry's module): control's runs end
    bitwise identical, dropout's seeds part the runs alone, and the workers load PyTorch without Keras. (A module of
    one's own on images: ``test_a_modules_stability_runs_take_the_images_channels_first``.)"""
    monkeypatch.chdir(folder)
    out = tmp_path / "hf_gpt2_tiny"
    args = ["stability", "--model", "hf_gpt2_tiny", "--runs", "2", "--epochs", "1", "--variants", "control,dropout"]
    assert main([*args, "--out", str(out)]) == ExitCode.OK, capsys.readouterr().err
    summary = json.loads((out / "stability" / "summary.json").read_text())
    variants = {variant["variant"]: variant for variant in summary["variants"]}
    check = variants["control"]["determinism_check"]
    assert check["verified"] is True and check["eager"] is True
    assert check["line"].endswith(("trained in one process", "trained in 2 processes")), check["line"]
    assert variants["dropout"]["distinct_weights"] == 2
    records = list(ResultsStore(out, "stability").records())
    assert {(r["status"], r["backend"]) for r in records} == {("ok", "torch")}
    assert all("keras" not in r["software"] and r["train_step"].startswith("eager PyTorch") for r in records)
    assert {(tuple(r["input_shape"]), tuple(r["data_shape"])) for r in records} == {((16,), (16,))}
    capsys.readouterr()


OWN_GPT2 = """
from transformers import GPT2Config, GPT2LMHeadModel


def gpt2(input_shape, classes):
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=classes, n_positions=input_shape[0]))
"""
"""A language model of one's own: Hugging Face's GPT-2, built for the vocabulary and length it is given."""


@pytest.mark.slow
def test_a_stability_study_of_a_module_of_tokens_of_ones_own_trains_on_the_markov_language_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Without ``--dataset`` a model of your own takes the default for what it takes, as a registry model does: a
    module of token ids the Markov language (built for its 64 tokens and 16 positions), not the digits' images."""
    (tmp_path / "own_gpt2.py").write_text(OWN_GPT2)
    monkeypatch.chdir(tmp_path)
    args = ["stability", "--model", "own_gpt2.py:gpt2", "--runs", "2", "--epochs", "1", "--variants", "control"]
    assert main([*args, "--out", str(tmp_path / "out")]) == ExitCode.OK, capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "stability" / "summary.json").read_text())
    assert (summary["dataset"], summary["takes"], summary["classes"]) == ("markov", "tokens", 64)
    (control,) = summary["variants"]
    assert control["determinism_check"]["verified"] is True
    capsys.readouterr()


def test_a_modules_stability_runs_take_the_images_channels_first(folder: Path) -> None:
    """A module of one's own on the digits (8x8x1 images): its stability runs feed it 1x8x8, learn, and read the
    penultimate features off its head's input; the same seeds build the same module, another init seed another."""
    from detprof.stability import datasets
    from detprof.stability.module_training import ModuleTrainer
    from detprof.stability.variants import RunSeeds

    digits = datasets.load("digits")
    model = replace(own.parse(f"{folder / 'modules.py'}:net"), api=kinds.TORCH.api)
    trainer = ModuleTrainer(model, digits.input_shape, digits.takes, digits.classes, 1e-2)
    assert trainer.input_shape == (1, 8, 8)
    seeds = RunSeeds(init=1, shuffle=2, augment=3, dropout=4, bitflip=None)
    trainer.reset(seeds)
    first = trainer.trainable_vector()
    losses = [trainer.train_step(digits.x_train[:64], digits.y_train[:64])[0] for _ in range(5)]
    assert losses[-1] < losses[0]
    features, logits = trainer.infer(digits.x_test[:10], 5)
    assert features.shape == (10, 8) and logits.shape == (10, digits.classes)
    trainer.reset(seeds)
    assert (trainer.trainable_vector() == first).all()
    trainer.reset(replace(seeds, init=5))
    assert not (trainer.trainable_vector() == first).all()
    # a module cast to bfloat16 is fed its images in bfloat16, and its weights read exactly (widened to float32)
    model = replace(own.parse(f"{folder / 'modules.py'}:bfloat16"), api=kinds.TORCH.api)
    trainer = ModuleTrainer(model, digits.input_shape, digits.takes, digits.classes, 1e-2)
    trainer.reset(seeds)
    trainer.train_step(digits.x_train[:64], digits.y_train[:64])
    assert trainer.trainable_vector().dtype == np.float32 and trainer.infer(digits.x_test[:10], 5)[1].shape == (10, 10)
    floating = {a.dtype for _, arrays in trainer.layer_weights() for a in arrays if a.dtype.kind == "f"}
    assert floating == {np.dtype(np.float32)}  # batch norm's count of batches stays int64


def test_a_module_that_scores_every_position_only_given_its_targets_trains_and_infers_on_every_position(
    folder: Path,
) -> None:
    """nanoGPT scores only the last position without targets: a stability run still trains the study's cross-entropy
    on every position's logits (given the targets, its own loss unread) and reads every position's in inference."""
    from detprof.stability.module_training import ModuleTrainer
    from detprof.stability.variants import RunSeeds

    model = replace(own.parse(f"{folder / 'modules.py'}:last_scored"), api=kinds.TORCH.api)
    trainer = ModuleTrainer(model, (6,), "tokens", 50, 1e-2)
    trainer.reset(RunSeeds(init=1, shuffle=2, augment=3, dropout=4, bitflip=None))
    assert trainer.training is not None
    assert not trainer.training.own_loss and trainer.training.labels_keyword == "targets"
    assert trainer.step_name == "eager PyTorch: forward, cross-entropy, backward, AdamW.step"
    ids = np.random.default_rng(0).integers(0, 50, (8, 7))
    losses = [trainer.train_step(ids[:, :-1], ids[:, 1:])[0] for _ in range(5)]
    assert losses[-1] < losses[0]
    _, logits = trainer.infer(ids[:, :-1], 4)
    assert logits.shape == (8, 6, 50)


def assert_compiled(out: Path) -> None:
    """A compiled sweep's records and report: the step through torch.compile, Inductor's deterministic mode on in
    deterministic mode alone, PyTorch's compiler caches kept as the user's jobs keep them (a measured run is compared
    with none), the compiled region (GPT-2's own loss in it) and the update as rows with under 5% left over, and
    the fused kernels and Inductor's graph calls under one name each in the kernel tables."""
    store = ResultsStore(out, "sweep")
    records = list(store.records())
    assert {(r["mode"], r["status"], r["settings"]["inductor_deterministic"]) for r in records} == {
        ("default", "ok", False),
        ("deterministic", "ok", True),
    }
    assert {r["train_step"] for r in records} == {
        "torch.compile (inductor): forward, its own loss (ForCausalLMLoss), backward, AdamW.step"
    }
    assert not any("compilation_cache" in r for r in records)
    (model,) = json.loads(render_report([out], "json"))["models"]
    layers = {layer["name"]: layer["default_ms"] for layer in model["layers"]}
    assert set(layers) >= {COMPILED_PART, OPTIMIZER_PART}  # its loss compiled in
    assert typical_unattributed_share(out, model["model"]) < 0.05
    # Inductor's fused kernels in the modules they fused, the forward's and the backward's (a kernel both blocks
    # call in the module around them, transformer.h), and its matrix products (extern kernels) in the modules that
    # called them: GPT-2's projections (Conv1D, an addmm alone) and its head are rows of their own. The compiled
    # region keeps what no module claims: on a CPU, mostly the compiled call's own Python.
    assert "transformer.h" in layers and any(name.startswith("transformer.h.") for name in layers), sorted(layers)
    assert {"transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj", "lm_head"} <= set(layers), sorted(layers)
    in_modules = sum(ms for name, ms in layers.items() if name.startswith(("transformer", "lm_head")))
    assert in_modules > 0.5 * sum(layers.values()) and layers[COMPILED_PART] < 0.3 * sum(layers.values()), layers
    for record in records:
        table = pd.read_parquet(store.dir / record["kernel_table"])
        names = set(table["name"])
        assert any(re.match(r"graph_\d+_cpp_fused_", name) for name in names), sorted(names)[:20]
        assert not any(name.startswith("## Call CompiledFxGraph ") and name != COMPILED_GRAPH_CALL for name in names)
        # In both modes, as the leaderboard sums them: the deterministic backward also runs index_put_, which
        # provenance tracking does not list.
        frame, steps = counted_steps(table, record)
        layer_names, step_scopes = record["layer_names"], record.get("step_scopes") or {}
        by_layer = run_parts(frame, steps, layer_names, step_scopes, record["kernel_modules"]).layer_kernels
        products = {key: ns for key, ns in by_layer.items() if key[1] in ("aten::mm", "aten::addmm", "aten::bmm")}
        left = sum(ns for (layer, _), ns in products.items() if layer == COMPILED_PART) / sum(products.values())
        assert left < 0.05, (record["mode"], left)


def test_a_model_function_that_needs_a_missing_model_package_names_its_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision, timm and transformers are not detprof's to install: a model file that imports one where it is
    missing (here made so, whatever is installed) is one line naming the install; any other missing module says
    what failed to import."""
    from detprof.models import own_build

    (tmp_path / "vision.py").write_text("import timm\n\n\ndef net():\n    return timm.create_model('resnet50')\n")
    (tmp_path / "other.py").write_text("import no_such_package_here\n\n\ndef net():\n    pass\n")
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(UsageError, match=r"vision.py:net needs timm, which is not installed here: pip install timm$"):
        own_build.factory(own.parse(f"{tmp_path / 'vision.py'}:net"))
    with pytest.raises(UsageError, match=r"other.py:net: importing .*other.py failed: No module named 'no_such_pa"):
        own_build.factory(own.parse(f"{tmp_path / 'other.py'}:net"))


def test_a_native_registry_model_without_transformers_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where transformers is not installed, naming a native registry model says which install brings it, before
    anything starts (the package looked up, not imported)."""
    import importlib.util

    from detprof.models import registry

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else found(name, *a)
    )
    line = r"^hf_vit_tiny needs transformers, which is not installed here: pip install 'detprof\[huggingface\]'$"
    with pytest.raises(UsageError, match=line):
        registry.native_model("hf_vit_tiny")
    assert registry.native_model("smallcnn") is None


def test_logits_and_a_loss_are_read_from_each_form_a_module_returns() -> None:
    """A tensor, a Hugging Face output, a dict, and a tuple whose one scalar is the loss (nanoGPT's)."""
    import torch
    from transformers.modeling_outputs import CausalLMOutput

    from detprof.models.torch_modules import logits_of, loss_in

    logits, loss = torch.ones(2, 3), torch.tensor(0.5)
    for output in (CausalLMOutput(loss=loss, logits=logits), {"logits": logits, "loss": loss}, (logits, loss)):
        assert logits_of(output) is logits and loss_in(output) is loss
    assert logits_of(logits) is logits and loss_in(logits) is None
    assert logits_of({"out": logits, "aux": torch.zeros(2, 3)}) is logits  # a torchvision segmentation model's
    assert loss_in((logits, None)) is None and loss_in((logits, loss, loss)) is None  # no scalar, or two: none
    # the loss named and ranged is the one the model runs: GPT-2 calls its loss_function, T5 its own cross-entropy
    from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

    from detprof.models.torch_modules import _calls_loss_function

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=16, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2))
    assert _calls_loss_function(gpt2) and not _calls_loss_function(t5)


def test_a_hugging_face_model_class_given_as_the_function_is_told_to_be_built_from_its_configuration() -> None:
    from transformers import BertForSequenceClassification

    from detprof.models import own_build

    given = "transformers:BertForSequenceClassification"
    said = r"returns BertForSequenceClassification\(BertConfig\(\.\.\.\)\) \(or its from_pretrained of a folder here\)$"
    taken = r"must take no arguments or \(input_shape, classes\), not \(config: .*"
    with pytest.raises(UsageError, match=taken + said):
        own_build.takes_arguments(BertForSequenceClassification, given)
