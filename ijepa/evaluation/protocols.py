"""The evaluation protocols, each chosen by ``class_path`` with its own options.

A :class:`Protocol` turns an :class:`~ijepa.evaluation.context.EvalContext` (the frozen
encoder's cached features, the validation split carved from the train labels, augmented
batches) into a result: every head's validation score, the head selected on validation, and
the selected head's test score. No protocol reads the test split before its head is chosen.

A new protocol is one subclass with a ``kind`` and :meth:`Protocol.evaluate`; the CLI lists the
subclasses, never a fixed list of names.
"""

from __future__ import annotations

import abc
import itertools
import math
import time
from pathlib import Path

import torch

from ijepa.classifiers import (
    AttentiveHeadGrid,
    HeadGridTrainer,
    LinearHeadGrid,
    feature_batches,
    grid_loss,
    grid_scores,
    knn_sweep,
    logreg_sweep,
    top1,
)
from ijepa.evaluation.context import EvalContext
from ijepa.evaluation.readouts import Readout, is_pooled, readout_from_config
from ijepa.evaluation.splits import item_names, low_shot_indices, named_indices, read_subset_file
from ijepa.nn.checks import check_range
from ijepa.registry import concrete_subclasses


def _check_grid(values: list, name: str, low: float, low_open: bool = False) -> list[float]:
    if not values:
        raise ValueError(f"{name} must hold at least one value: a grid of zero heads selects nothing.")
    for value in values:
        check_range(value, name, low, low_open=low_open)
    return [float(value) for value in values]


def _check_counts(values: list, name: str) -> list[int]:
    if not values:
        raise ValueError(f"{name} must hold at least one value.")
    for value in values:
        check_range(value, name, 1)
        if int(value) != value:
            raise ValueError(f"{name} must hold integers >= 1, got {value}.")
    return [int(value) for value in values]


def select(heads: list[dict], score: str = "val_top1") -> dict:
    """The head with the best validation ``score``; ties go to the first in grid order."""
    return max(heads, key=lambda head: head[score])  # max keeps the first of equal scores


def grid_edges(heads: list[dict], selected: str | None) -> list[tuple[str, float, str]]:
    """``(setting, value, "largest" | "smallest")`` for each numeric setting swept over at least
    three values whose selected value is an end of the sweep (a weight decay of 0 is a natural
    floor, not an edge)."""
    chosen = next((head for head in heads if head["name"] == selected), None)
    if chosen is None:
        return []
    edges = []
    for key, value in chosen["settings"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        values = sorted({head["settings"][key] for head in heads})
        if len(values) < 3:
            continue
        if value == values[-1]:
            edges.append((key, value, "largest"))
        elif value == values[0] and not (key == "weight_decay" and value == 0):
            edges.append((key, value, "smallest"))
    return edges


class Protocol(abc.ABC):
    """Base of the protocols. ``kind`` names the protocol in the results (``<name>.json``);
    ``name`` (default: the kind) tells two configurations of one kind apart; ``reads`` is the
    target it needs of the data: image ``labels`` (every source with labels), or the ``masks``
    or ``counts`` of dense data (:mod:`ijepa.evaluation.dense`)."""

    kind: str = ""
    reads: str = "labels"

    def __init__(self, name: str | None = None):
        self.name = name or self.kind

    def settings(self) -> dict:
        """The options, as the results file records them."""
        return {
            key: value.config() if isinstance(value, Readout) else value
            for key, value in vars(self).items()
            if not key.startswith("_")
        }

    @abc.abstractmethod
    def evaluate(self, ctx: EvalContext) -> dict:
        """``{"heads": [{"name", "settings", "val_top1"}, ...], "selected": name, "val_top1",
        "test_top1", ...}``."""

    def edges(self, result: dict) -> list[tuple[str, float, str]]:
        """The selected head's settings at an end of their sweep (:func:`grid_edges`)."""
        return grid_edges(result["heads"], result["selected"])

    def run(self, ctx: EvalContext) -> dict:
        start = time.perf_counter()
        result = self.evaluate(ctx)
        result["at_grid_edge"] = self.edges(result)
        for key, value, side in result["at_grid_edge"]:
            ctx.warn(
                f"{self.name}: the selected head's {key}={value:g} is the {side} of the {key} values tried; the best "
                f"may lie beyond it: widen the grid."
            )
        return {
            "protocol": self.kind,
            "name": self.name,
            "settings": self.settings(),
            **result,
            "seconds": round(time.perf_counter() - start, 3),
        }


class KNNProtocol(Protocol):
    """k-NN on pooled features of the last block (``readout``: the mean-pool by default): cosine
    similarity, each of the ``k`` neighbours votes ``exp(cosine / temperature)`` (DINO). The bank
    is the train split without its validation part; ``k`` is selected on the validation part.

    Args:
        ks: the neighbour counts tried (a k above the bank's size uses the whole bank).
        temperature: of the votes.
        readout: how tokens become one vector (:mod:`ijepa.evaluation.readouts`; null: the mean).
        name: the results' name (default ``knn``).
    """

    kind = "knn"

    def __init__(
        self,
        ks: list[int] = (10, 20, 100, 200),
        temperature: float = 0.07,
        readout: Readout | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        self.ks = _check_counts(list(ks), "ks")
        check_range(temperature, "temperature", 0, low_open=True)
        self.temperature = temperature
        self.readout = readout_from_config(readout)

    def evaluate(self, ctx: EvalContext) -> dict:
        kind = ctx.pooled(self.readout)
        x_train, y_train, x_val, y_val = ctx.train_val(kind, 1)
        device = ctx.fabric.device
        bank, bank_labels = x_train.to(device), y_train.to(device)
        val_scores = knn_sweep(bank, bank_labels, x_val.to(device), ctx.num_classes, self.ks, self.temperature)
        heads = [{"name": f"k={k}", "settings": {"k": k}, "val_top1": top1(val_scores[k], y_val)} for k in self.ks]
        best = select(heads)
        x_test, y_test = ctx.features("test", kind, 1)
        k = best["settings"]["k"]
        test = knn_sweep(bank, bank_labels, x_test.to(device), ctx.num_classes, [k], self.temperature)[k]
        return {
            "heads": heads,
            "selected": best["name"],
            "val_top1": best["val_top1"],
            "test_top1": top1(test, y_test),
        }


class LogRegProtocol(Protocol):
    """Logistic regression (L-BFGS, sklearn's objective ``C * sum CE + |W|^2 / 2``) on standardised
    pooled features of the last ``last_blocks`` blocks, over a sweep of ``C``; ``C`` is
    selected on the validation part of the train split.

    Args:
        Cs: the inverse regularisation strengths tried (DINOv2 sweeps 45 values over 1e-6 .. 1e5).
        max_iter: L-BFGS iterations per fit.
        last_blocks: concatenate the pooled outputs of this many last blocks.
        readout: how tokens become one vector (:mod:`ijepa.evaluation.readouts`; null: the mean).
        name: the results' name (default ``logreg``).
    """

    kind = "logreg"

    def __init__(
        self,
        Cs: list[float] = tuple(10.0 ** (e / 4) for e in range(-24, 21)),
        max_iter: int = 1000,
        last_blocks: int = 1,
        readout: Readout | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        self.Cs = _check_grid(list(Cs), "Cs", 0, low_open=True)
        check_range(max_iter, "max_iter", 1)
        check_range(last_blocks, "last_blocks", 1)
        self.max_iter, self.last_blocks = max_iter, last_blocks
        self.readout = readout_from_config(readout)

    def fit_select_test(self, ctx: EvalContext, x_train, y_train, x_val, y_val) -> tuple[list[dict], dict, float]:
        device = ctx.fabric.device
        fits = logreg_sweep(
            x_train.to(device),
            y_train.to(device),
            x_val.to(device),
            y_val.to(device),
            ctx.num_classes,
            self.Cs,
            self.max_iter,
        )
        heads = [
            {"name": f"C={fit['C']:.3g}", "settings": {"C": fit["C"]}, "val_top1": fit["val_top1"]} for fit in fits
        ]
        best = select(heads)
        classifier = fits[heads.index(best)]["classifier"]
        x_test, y_test = ctx.features("test", ctx.pooled(self.readout), self.last_blocks)
        with torch.no_grad():
            test = top1(classifier(x_test.to(device).to(classifier.weight.dtype)), y_test)
        return heads, best, test

    def evaluate(self, ctx: EvalContext) -> dict:
        heads, best, test = self.fit_select_test(ctx, *ctx.train_val(ctx.pooled(self.readout), self.last_blocks))
        return {"heads": heads, "selected": best["name"], "val_top1": best["val_top1"], "test_top1": test}


class LowShotProtocol(Protocol):
    """Few labels: logistic regression (a sweep of ``C`` selected on validation) fitted on a
    class-balanced share of the train split, disjoint from validation. ``fractions`` of each class
    (1% and 10%, as I-JEPA's low-shot ImageNet) and ``shots`` images per class, each over ``tries``
    seeded draws: the mean and standard deviation of the test scores.

    ``subset_files`` fit on a fixed list of images instead of a draw (the 1% ImageNet list of
    SimCLR / MSN / I-JEPA): one setting per file, named by its stem, fitted once. A line names an
    item of the train split by its path relative to the split's root
    (``n01440764/n01440764_10026.JPEG``), by its file name (``n01440764_10026.JPEG``), or, for
    data without files (generated shapes), by its index. A listed image that falls in the
    validation part is fitted on all the same (the paper's subset, whole) and leaves the
    validation part for that setting: ``C`` is selected on the other validation images, so the
    images a head is fitted on and the images that select it stay disjoint. The results record
    the file's path and SHA-256, its images and how many left validation (``left_validation``).

    Args:
        fractions: shares of each class's training images (at least one image per class).
        shots: images per class; each at most the smallest class's training images.
        tries: draws per setting.
        Cs: the ``C`` sweep of each fit.
        max_iter: L-BFGS iterations per fit.
        last_blocks, readout: as :class:`LogRegProtocol`.
        subset_files: files of image names, one a line (blank lines and ``#`` comments ignored).
        name: the results' name (default ``low_shot``).
    """

    kind = "low_shot"

    def __init__(
        self,
        fractions: list[float] = (0.01, 0.1),
        shots: list[int] = (1, 5, 10),
        tries: int = 5,
        Cs: list[float] = tuple(10.0**e for e in range(-4, 5)),
        max_iter: int = 1000,
        last_blocks: int = 1,
        subset_files: list[str] = (),
        readout: Readout | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        self.readout = readout_from_config(readout)
        self.fractions = [float(f) for f in fractions]
        for fraction in self.fractions:
            check_range(fraction, "fractions", 0, 1, low_open=True)
        self.shots = _check_counts(list(shots), "shots") if shots else []
        self.subset_files = [str(path) for path in subset_files]
        if not self.fractions and not self.shots and not self.subset_files:
            raise ValueError(
                "fractions, shots and subset_files are all empty: a low-shot evaluation needs at least one setting."
            )
        # Read now, not after minutes of feature extraction: a missing or empty file fails first.
        self._subsets = {path: read_subset_file(path) for path in self.subset_files}
        stems = [Path(path).stem for path in self.subset_files]
        repeated = sorted({stem for stem in stems if stems.count(stem) > 1})
        if repeated:
            raise ValueError(
                f"subset_files: each file names its setting by its stem; {repeated} name more than one: rename them."
            )
        check_range(tries, "tries", 1)
        self.tries = tries
        self.Cs = _check_grid(list(Cs), "Cs", 0, low_open=True)
        check_range(max_iter, "max_iter", 1)
        check_range(last_blocks, "last_blocks", 1)
        self.max_iter, self.last_blocks = max_iter, last_blocks

    def subset_from_file(self, ctx: EvalContext, path: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``(rows [M], val_rows [V], record)``: the rows of the train split's features that the
        subset file ``path`` names, the rows of the validation part without them (they select
        ``C``), and what the results record of the file. ValueError naming the file for a name
        that matches no labelled item of the train split, or a subset that empties validation."""
        names, sha256 = self._subsets[path]
        # positions: each feature row's index in the train dataset (unlabelled items have no row)
        positions = ctx._entry("train", ctx.pooled(self.readout), self.last_blocks)["positions"]
        dataset_names = item_names(ctx.data.dataset("train", ctx.size))
        rows = named_indices([dataset_names[p] for p in positions.tolist()], names, f"subset file {Path(path).name}")
        in_subset = torch.zeros(len(positions), dtype=torch.bool)
        in_subset[rows] = True
        val_rows = ctx.val_idx[~in_subset[ctx.val_idx]]
        if len(val_rows) == 0:
            raise ValueError(
                f"subset file {Path(path).name} names every image of the validation part ({len(ctx.val_idx)} images): "
                "none is left to select C; list fewer images or raise data.val_fraction."
            )
        record = {
            "subset_file": path,
            "sha256": sha256,
            "images": len(rows),
            "left_validation": len(ctx.val_idx) - len(val_rows),
            "val_images": len(val_rows),
        }
        return rows, val_rows, record

    def evaluate(self, ctx: EvalContext) -> dict:
        x_all, y_all = ctx.features("train", ctx.pooled(self.readout), self.last_blocks)
        x_val, y_val = x_all[ctx.val_idx], y_all[ctx.val_idx]
        inner = LogRegProtocol(self.Cs, self.max_iter, self.last_blocks, self.readout)
        settings = [("fraction", f, f"{100 * f:g}%") for f in self.fractions]
        settings += [("shots", s, f"{s}-shot") for s in self.shots]
        for key, value, _ in settings:  # every subset is checked before the first fit
            low_shot_indices(y_all, ctx.train_idx, **{key: value}, seed=ctx.seed, trial=0)
        files = {path: self.subset_from_file(ctx, path) for path in self.subset_files}
        results = []
        for key, value, label in settings:
            tests, selected, sizes = [], [], []
            for trial in range(self.tries):
                subset = low_shot_indices(y_all, ctx.train_idx, **{key: value}, seed=ctx.seed, trial=trial)
                _, best, test = inner.fit_select_test(ctx, x_all[subset], y_all[subset], x_val, y_val)
                tests.append(test)
                selected.append(best["settings"]["C"])
                sizes.append(len(subset))
            mean = sum(tests) / len(tests)
            std = math.sqrt(sum((t - mean) ** 2 for t in tests) / max(1, len(tests) - 1))
            results.append(
                {
                    "name": label,
                    key: value,
                    "images": sizes[0],
                    "test_top1": tests,
                    "mean": mean,
                    "std": std,
                    "selected_C": selected,
                }
            )
            ctx.log({f"{self.name}/{label}/test_top1": mean})
        for path, (rows, val_rows, record) in files.items():  # a fixed subset: one fit, no tries
            label = Path(path).stem
            _, best, test = inner.fit_select_test(ctx, x_all[rows], y_all[rows], x_all[val_rows], y_all[val_rows])
            results.append(
                {
                    "name": label,
                    **record,
                    "test_top1": [test],
                    "mean": test,
                    "std": 0.0,
                    "selected_C": [best["settings"]["C"]],
                }
            )
            ctx.log({f"{self.name}/{label}/test_top1": test})
        return {"heads": [], "selected": None, "val_top1": None, "test_top1": None, "settings_results": results}


class HeadGridProtocol(Protocol):
    """A grid of heads trained together by minibatch descent on frozen features computed once per
    batch: on augmented images encoded on the fly (``augment: true``, a new random resized crop and
    flip of every image at every epoch), or on the cached features of the evaluation transform.
    Every head of the grid starts from the same seeded initialisation and has its own learning
    rate and weight decay; a cosine schedule decays them all. The head with the best validation
    score is tested. Subclasses build the grids (:meth:`grids`) and say which features they read."""

    feature_kind = "blocks"
    loss = staticmethod(grid_loss)  # the grid's summed loss of (logits, targets)

    def __init__(
        self,
        lrs: list[float],
        weight_decays: list[float],
        epochs: int,
        batch_size: int | None,
        optimizer: str,
        warmup_epochs: float,
        augment: bool,
        name: str | None,
    ):
        super().__init__(name)
        self.lrs = _check_grid(list(lrs), "lrs", 0, low_open=True)
        self.weight_decays = _check_grid(list(weight_decays), "weight_decays", 0)
        check_range(epochs, "epochs", 1)
        if batch_size is not None:
            check_range(batch_size, "batch_size", 1)
        if optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}.")
        check_range(warmup_epochs, "warmup_epochs", 0, epochs)
        self.epochs, self.batch_size, self.optimizer = epochs, batch_size, optimizer
        self.warmup_epochs, self.augment = warmup_epochs, augment

    @property
    def points(self) -> list[tuple[float, float]]:
        """``(lr, weight_decay)`` of each head of a grid, in grid order."""
        return list(itertools.product(self.lrs, self.weight_decays))

    @property
    def blocks_needed(self) -> int:
        return 1

    @abc.abstractmethod
    def grids(self, ctx: EvalContext, width: int) -> list[tuple[str, dict, torch.nn.Module]]:
        """``(label, settings, grid)`` of each grid; every grid has one head per :attr:`points`."""

    @abc.abstractmethod
    def grid_input(self, settings: dict, features: torch.Tensor) -> torch.Tensor:
        """The part of a batch's features ``grid`` reads."""

    def trainer(
        self, ctx: EvalContext, width: int, total_steps: int, warmup_steps: int = 0
    ) -> tuple[list[tuple[str, dict, torch.nn.Module]], HeadGridTrainer]:
        """The grids on the context's device, and their trainer (optimisers and schedules)."""
        grids = [(label, settings, grid.to(ctx.fabric.device)) for label, settings, grid in self.grids(ctx, width)]
        lrs, wds = [p[0] for p in self.points], [p[1] for p in self.points]
        readers = [(grid, self.reader(settings)) for _, settings, grid in grids]
        return grids, HeadGridTrainer(readers, lrs, wds, self.optimizer, total_steps, warmup_steps, loss=self.loss)

    def reader(self, settings: dict):
        """``features -> grid input`` of the grid with ``settings`` (:meth:`grid_input`)."""
        return lambda features: self.grid_input(settings, features)

    def grid_splits(self, ctx: EvalContext) -> tuple:
        """``(x_train, y_train, x_val, y_val)`` of :attr:`feature_kind`; with ``augment`` the train
        split is encoded batch by batch, augmented (:meth:`train_grids`): only validation is extracted."""
        kind, blocks = self.feature_kind, self.blocks_needed
        if self.augment:
            return (None, None, *ctx.val_features(kind, blocks))
        return ctx.train_val(kind, blocks)

    def train_grids(
        self, ctx: EvalContext, width: int, x_train: torch.Tensor | None, y_train: torch.Tensor | None
    ) -> tuple[list[tuple[str, dict, torch.nn.Module]], int]:
        """The grids (:meth:`trainer`) trained for ``epochs`` on augmented batches or the cached
        ``x_train``, ``y_train``, logging the mean loss per head -> ``(grids, steps)``."""
        kind, blocks = self.feature_kind, self.blocks_needed
        batch_size = self.batch_size or ctx.data.batch_size
        steps_per_epoch = ctx.steps_per_epoch(batch_size)
        total = self.epochs * steps_per_epoch
        grids, trainer = self.trainer(ctx, width, total, round(self.warmup_epochs * steps_per_epoch))
        if self.augment:
            batches = (
                b for epoch in range(self.epochs) for b in ctx.augmented_batches(epoch, batch_size, kind, blocks)
            )
        else:
            batches = feature_batches(x_train, y_train, batch_size, ctx.seed, total)
        heads = len(grids) * len(self.points)
        trainer.fit(
            batches,
            ctx.fabric.device,
            total,
            lambda step, loss: ctx.log({f"{self.name}/train_loss": loss / heads}, step),
        )
        return grids, total

    def evaluate(self, ctx: EvalContext) -> dict:
        kind, blocks = self.feature_kind, self.blocks_needed
        batch_size = self.batch_size or ctx.data.batch_size
        x_train, y_train, x_val, y_val = self.grid_splits(ctx)
        width = x_val.size(-1) // (blocks if is_pooled(kind) else 1)
        grids, total = self.train_grids(ctx, width, x_train, y_train)
        step = total
        heads, classifiers = [], []
        for label, settings, grid in grids:
            grid.eval()
            scores = grid_scores(grid, x_val, y_val, batch_size, self.reader(settings))
            for (lr, wd), score in zip(self.points, scores):
                name = f"{label}lr={lr:g},wd={wd:g}"
                heads.append({"name": name, "settings": {**settings, "lr": lr, "weight_decay": wd}, "val_top1": score})
                classifiers.append((grid, settings, len(classifiers) % len(self.points)))
                ctx.log({f"{self.name}/val_top1/{name}": score}, step)
        best = select(heads)
        grid, settings, index = classifiers[heads.index(best)]
        x_test, y_test = ctx.features("test", kind, blocks)
        test = grid_scores(grid, x_test, y_test, batch_size, self.reader(settings))[index]
        return {
            "heads": heads,
            "selected": best["name"],
            "val_top1": best["val_top1"],
            "test_top1": test,
            "steps": total,
        }


class LinearProtocol(HeadGridProtocol):
    """A grid of linear heads (DINOv2's linear evaluation): every learning rate x weight decay,
    for each choice of features (the mean of the last block's tokens, or of each of the last n
    blocks, concatenated; with or without a BatchNorm without affine), trained in one pass.

    Args:
        lrs: learning rates (one head each).
        weight_decays: weight decays (one head each, crossed with ``lrs``).
        last_blocks: feature choices: concatenate the pooled outputs of this many last blocks.
        batch_norm: feature choices: a BatchNorm without affine before the heads, or not.
        readout: how each block's tokens become one vector (:mod:`ijepa.evaluation.readouts`; null: the mean).
        epochs: passes over the train split.
        batch_size: images per step, across all processes (null: ``data.batch_size``).
        optimizer: ``sgd`` (momentum 0.9, as DINOv2) or ``adamw``.
        warmup_epochs: linear warm-up before the cosine decay.
        augment: random resized crop and flip of the training images, encoded at every step;
            false: the cached features of the evaluation transform (much faster, a few points lower).
        name: the results' name (default ``linear``).
    """

    kind = "linear"

    def __init__(
        self,
        lrs: list[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        weight_decays: list[float] = (0.0, 5e-4),
        last_blocks: list[int] = (1,),
        batch_norm: list[bool] = (False,),
        epochs: int = 10,
        batch_size: int | None = None,
        optimizer: str = "sgd",
        warmup_epochs: float = 0.0,
        augment: bool = True,
        readout: Readout | None = None,
        name: str | None = None,
    ):
        super().__init__(lrs, weight_decays, epochs, batch_size, optimizer, warmup_epochs, augment, name)
        self.readout = readout_from_config(readout)
        self.last_blocks = _check_counts(list(last_blocks), "last_blocks")
        if not batch_norm:
            raise ValueError("batch_norm must hold at least one value (false, true or both).")
        self.batch_norm = [bool(b) for b in batch_norm]

    @property
    def blocks_needed(self) -> int:
        return max(self.last_blocks)

    def evaluate(self, ctx: EvalContext) -> dict:
        self.feature_kind = ctx.pooled(self.readout)  # the readout's features, registered with the context
        return super().evaluate(ctx)

    def grids(self, ctx: EvalContext, width: int):
        if self.blocks_needed > ctx.encoder.depth:
            raise ValueError(
                f"last_blocks must be in 1..{ctx.encoder.depth} (the encoder's depth), got {self.blocks_needed}."
            )
        return [
            (
                f"blocks={n},bn={int(bn)},",
                {"last_blocks": n, "batch_norm": bn},
                LinearHeadGrid(n * width, ctx.num_classes, len(self.points), batch_norm=bn, seed=ctx.seed),
            )
            for n in self.last_blocks
            for bn in self.batch_norm
        ]

    def grid_input(self, settings: dict, features: torch.Tensor) -> torch.Tensor:
        n, total = settings["last_blocks"], self.blocks_needed
        width = features.size(-1) // total
        return features[:, (total - n) * width :]


class AttentiveProtocol(HeadGridProtocol):
    """V-JEPA's attentive probe: learnable queries cross-attend over every token of the last
    block (after ``depth - 1`` self-attention blocks), then a linear head; a grid of such heads
    over learning rate x weight decay, trained in one pass with AdamW.

    Args:
        lrs, weight_decays: the grid (V-JEPA 2 uses 21 heads over both).
        depth: blocks of each head (the last one cross-attention; V-JEPA 2 uses 4).
        num_heads: attention heads (must divide the encoder's width; V-JEPA 2 uses 16).
        num_queries: learnable queries, averaged before the linear layer.
        epochs, batch_size, warmup_epochs, augment: as :class:`LinearProtocol`.
        optimizer: ``adamw`` (as V-JEPA) or ``sgd``.
        name: the results' name (default ``attentive``).
    """

    kind = "attentive"
    feature_kind = "tokens"

    def __init__(
        self,
        lrs: list[float] = (1e-4, 3e-4, 1e-3, 3e-3),
        weight_decays: list[float] = (0.01, 0.1),
        depth: int = 1,
        num_heads: int = 4,
        num_queries: int = 1,
        epochs: int = 10,
        batch_size: int | None = None,
        optimizer: str = "adamw",
        warmup_epochs: float = 0.0,
        augment: bool = True,
        name: str | None = None,
    ):
        super().__init__(lrs, weight_decays, epochs, batch_size, optimizer, warmup_epochs, augment, name)
        for value, label in ((depth, "depth"), (num_heads, "num_heads"), (num_queries, "num_queries")):
            check_range(value, label, 1)
        self.depth, self.num_heads, self.num_queries = depth, num_heads, num_queries

    def grids(self, ctx: EvalContext, width: int):
        if width % self.num_heads:
            divisors = [d for d in range(1, width + 1) if width % d == 0]
            # a wide encoder has many divisors: the line names the (at most 12) nearest the value asked for
            near = sorted(sorted(divisors, key=lambda d: (abs(d - self.num_heads), d))[:12])
            raise ValueError(
                f"num_heads={self.num_heads} must divide the encoder width {width}: try one of "
                f"{', '.join(map(str, near))}."
            )
        grid = AttentiveHeadGrid(
            width,
            ctx.num_classes,
            depth=self.depth,
            num_heads=self.num_heads,
            num_queries=self.num_queries,
            count=len(self.points),
            seed=ctx.seed,
        )
        return [("", {}, grid)]

    def grid_input(self, settings: dict, features: torch.Tensor) -> torch.Tensor:
        return features


def protocol_kinds(reads: str | None = None) -> dict[str, type[Protocol]]:
    """Every protocol class imported so far, by kind (the registry the CLI and docs read:
    :func:`ijepa.registry.concrete_subclasses`), sorted by kind; with ``reads``, those that read
    that target (``labels``: every source with labels)."""
    found = {cls.kind: cls for cls in concrete_subclasses(Protocol) if cls.kind and reads in (None, cls.reads)}
    return dict(sorted(found.items()))
