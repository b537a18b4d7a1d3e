"""A native PyTorch module's stability runs: the Keras ``Trainer``'s protocol, for a ``torch.nn.Module``.

Each noise source draws from its own seed, as for a Keras model: ``init`` seeds PyTorch
before the module (and its optimizer) are built afresh, which is what a fresh process
would hold; ``dropout`` then seeds PyTorch's generators, the only ones the steps draw
from (dropout masks, whichever module draws them); ``shuffle`` and ``augment`` are the
study's numpy generators, the images moved channels first as the module takes them;
``bitflip`` moves one parameter by an ulp. The step is the sweep's eager step
(``torch_modules.ModuleTraining``): the loss and optimizer the function returns with the module
(``detprof.Training``), else the study's protocol, cross-entropy on the logits (not a Hugging
Face model's own loss, which would shift labels that are already the next tokens) and AdamW at
``--lr``. Runs in workers only: torch is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from detprof.models import torch_modules
from detprof.models.npz_data import channels_first
from detprof.models.own import OwnModel
from detprof.stability import metrics, variants
from detprof.stability.variants import RunSeeds


def module_input_shape(data_shape: Sequence[int], takes: str) -> tuple[int, ...]:
    """One example as a module takes the study's data: token ids as they are, images channels first."""
    return tuple(data_shape) if takes == "tokens" else channels_first(tuple(data_shape))


class ModuleTrainer:
    """A native module rebuilt from ``init`` for every run (eager PyTorch compiles nothing to keep between runs)."""

    def __init__(self, own_model: OwnModel, data_shape: tuple[int, ...], takes: str, classes: int, lr: float) -> None:
        self.own_model, self.classes, self.lr = own_model, classes, lr
        self.input_shape = module_input_shape(data_shape, takes)
        self.images = takes != "tokens"
        self.training: torch_modules.ModuleTraining | None = None

    @property
    def outputs_probabilities(self) -> bool:
        """The module's output is a probability per class (it ends in a softmax), else its logits, as the sweep
        trains it (``torch_modules.scores_probabilities``)."""
        assert self.training is not None, "reset() builds the module"
        return self.training.probabilities

    @property
    def module(self) -> Any:
        assert self.training is not None, "reset() builds the module"
        return self.training.module

    @property
    def step_name(self) -> str:
        assert self.training is not None, "reset() builds the module"
        return str(self.training.facts()["train_step"])

    def reset(self, seeds: RunSeeds) -> dict[str, Any]:
        """The module and its optimizer built from ``init`` as a fresh process builds them, then PyTorch's
        generators seeded from ``dropout``; returns what was applied (the dropout modules, the flipped weight)."""
        import torch

        from detprof.models.own_build import as_given

        torch.manual_seed(seeds.init)
        given = as_given(self.own_model, self.input_shape, self.classes)
        spec = {"input_shape": list(self.input_shape), "batch_size": 1}
        self.training = torch_modules.training(given, spec, seeds.init, learning_rate=self.lr, own_loss=False)
        torch.manual_seed(seeds.dropout)
        dropout = torch.nn.modules.dropout._DropoutNd
        dropouts = [path for path, m in self.module.named_modules() if isinstance(m, dropout)]
        applied: dict[str, Any] = {"seeded_stochastic_layers": dropouts}
        if seeds.bitflip is not None:
            applied["bitflip"] = self._flip_one_weight(seeds.bitflip)
        return applied

    def _flip_one_weight(self, seed: int) -> dict[str, Any]:
        import torch

        named = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        which, index, upward = variants.one_weight([p.numel() for _, p in named], seed)
        name, parameter = named[which]
        with torch.no_grad():
            flat = parameter.view(-1)
            before = flat[index].clone()
            flat[index] = torch.nextafter(before, torch.tensor(np.inf if upward else -np.inf, dtype=before.dtype))
        return {"variable": name, "index": index, "before": float(before), "after": float(flat[index])}

    def _tensor(self, x: np.ndarray) -> Any:
        import torch

        values = torch.from_numpy(np.ascontiguousarray(x))
        if self.images:  # channels first, in the module's dtype
            values = values.permute(0, 3, 1, 2).contiguous().to(torch_modules.input_dtype(self.module))
        else:
            values = values.long()
        return values.to(self.training.x.device if self.training is not None else "cpu")

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One optimizer step: the batch's mean loss and how many of its labels the module got right."""
        assert self.training is not None, "reset() builds the module"
        labels = self._labels(y)
        loss, logits = self.training.train_on(self._tensor(x), labels)
        return float(loss), int((self.training.classes_last(logits).argmax(dim=-1) == labels).sum())

    def _labels(self, y: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(y).astype(np.int64)).to(self.training.x.device)

    def infer(self, x: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The penultimate features and the logits of every example, in inference mode (no dropout drawn, no running
        statistics updated), the module left in training mode."""
        import torch

        module = self.module
        features: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        taken: list[Any] = []
        holder, of_input = _feature_module(module)

        def take(_: Any, args: Any, output: Any) -> None:
            taken.append(args[0] if of_input else output)

        handle = holder.register_forward_hook(take)
        module.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(x), batch_size):
                    taken.clear()
                    logits = self.training.classes_last(
                        self.training.logits(self._tensor(x[start : start + batch_size]))
                    )
                    outputs.append(logits.float().cpu().numpy())
                    feature = taken[-1].float().cpu().numpy()
                    features.append(feature.reshape(len(feature), -1))
        finally:
            handle.remove()
            module.train()
        return np.concatenate(features), np.concatenate(outputs)

    def probabilities_and_loss(self, outputs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        return metrics.probabilities_and_loss(outputs, y, self.outputs_probabilities)

    def layer_weights(self) -> list[tuple[str, list[np.ndarray]]]:
        """Each module's own parameters and buffers, by path (the top module's by its class name), in module order."""
        module = self.module
        found = []
        for path, submodule in module.named_modules():
            own = [*submodule.parameters(recurse=False), *submodule.buffers(recurse=False)]
            if own:
                found.append((path or type(module).__name__, [_host(t) for t in own]))
        return found

    def trainable_vector(self) -> np.ndarray:
        return np.concatenate([_host(p).ravel() for p in self.module.parameters() if p.requires_grad])

    def named_weights(self) -> list[tuple[str, np.ndarray]]:
        return [(name, _host(t)) for name, t in self.module.state_dict().items()]


def _host(tensor: Any) -> np.ndarray:
    """A tensor's values in NumPy, exactly: a bfloat16 module's widened to float32 (``Backend.host_array``)."""
    from detprof import backends
    from detprof.models.kinds import TORCH

    return np.asarray(backends.get(TORCH.backend).host_array(tensor))


def _feature_module(module: Any) -> tuple[Any, bool]:
    """Where the penultimate features are read: the output of a submodule named ``penultimate``, else the input of
    the last submodule with parameters of its own (the classifier, a language model's head)."""
    named = dict(module.named_modules())
    if "penultimate" in named:
        return named["penultimate"], False
    leaves = [m for path, m in module.named_modules() if path and list(m.parameters(recurse=False))]
    return (leaves[-1] if leaves else module), bool(leaves)
