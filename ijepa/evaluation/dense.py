"""The dense and low-level protocols: linear semantic segmentation (DINOv2's) and object counting
(the I-JEPA paper's Clevr/Count), on data with masks and counts
(:class:`~ijepa.data.batch.DenseBatch`: ``ShapesSource(dense=True)``, ``ImageFolderSource(masks=...)``).

Both read the frozen encoder as the other protocols do (features cached per checkpoint, a head
grid trained in one pass, the head selected on the validation part of the train split, then
tested); they differ in what the heads predict: every pixel's class, or the image's number of
objects as a class.
"""

from __future__ import annotations

import torch

from ijepa.classifiers import (
    SegmentationHeadGrid,
    grid_confusions,
    segmentation_grid_loss,
    segmentation_scores,
    token_grid_ceiling,
)
from ijepa.data.batch import IGNORE_INDEX
from ijepa.evaluation.context import EvalContext
from ijepa.evaluation.protocols import (
    AttentiveProtocol,
    HeadGridProtocol,
    LinearProtocol,
    Protocol,
    grid_edges,
    select,
)
from ijepa.nn.checks import check_range


class SegmentationProtocol(HeadGridProtocol):
    """Linear semantic segmentation (DINOv2's linear protocol): a BatchNorm and a linear (1x1)
    layer on every patch token of the last block (or of the last ``last_blocks`` blocks,
    concatenated per token), logits ``[B, C, h, w]`` upsampled bilinearly to the mask's size,
    per-pixel cross-entropy that skips ignored pixels (:data:`~ijepa.data.batch.IGNORE_INDEX`).
    A grid of learning rates x weight decays is trained in one pass
    (:class:`~ijepa.classifiers.SegmentationHeadGrid`); the head with the best validation mIoU
    is tested: the results give its test mIoU, pixel accuracy and per-class IoU, and every head's
    validation mIoU. mIoU as mmsegmentation (DINOv2) computes it: intersections and unions summed
    over the whole split, the mean over the classes present in the masks or the predictions
    (:func:`~ijepa.classifiers.segmentation_scores`); the background (class 0) is a class. A test
    mask's label outside the heads' classes (the training labels, or ``num_classes``) is ignored
    as mmsegmentation ignores it, with a warning naming the mask files and labels
    (``ignored_test_labels``: ``{label: pixels}``). ``ceiling_miou`` is the test mIoU of each token's
    majority class as one-hot logits on the encoder's token grid, upsampled as the heads' logits
    (:func:`~ijepa.classifiers.token_grid_ceiling`): what a head that knew the answer per token
    would score; read ``test_miou`` against it, not against 1.

    Args:
        lrs, weight_decays: the grid (one head per pair).
        last_blocks: concatenate the patch tokens of this many last blocks (DINOv2's "multi-layer"
            variant uses 4).
        batch_norm: a BatchNorm (without affine, shared by the heads) before the linear layer.
        num_classes: classes of the masks; null: 1 + the largest class id in the train split's masks.
        epochs, batch_size, warmup_epochs: as :class:`~ijepa.evaluation.LinearProtocol`.
        optimizer: ``adamw`` (default) or ``sgd`` (momentum 0.9).
        augment: random resized crop and flip of every training image and its mask, encoded at
            every step; false (default): the cached patch tokens of the evaluation transform.
        name: the results' name (default ``segmentation``).
    """

    kind = "segmentation"
    reads = "masks"
    feature_kind = "patches"
    loss = staticmethod(segmentation_grid_loss)

    def __init__(
        self,
        lrs: list[float] = (1e-4, 3e-4, 1e-3, 3e-3),
        weight_decays: list[float] = (1e-4, 1e-3),
        last_blocks: int = 1,
        batch_norm: bool = True,
        num_classes: int | None = None,
        epochs: int = 10,
        batch_size: int | None = None,
        optimizer: str = "adamw",
        warmup_epochs: float = 0.0,
        augment: bool = False,
        name: str | None = None,
    ):
        super().__init__(lrs, weight_decays, epochs, batch_size, optimizer, warmup_epochs, augment, name)
        check_range(last_blocks, "last_blocks", 1)
        if int(last_blocks) != last_blocks:
            raise ValueError(f"last_blocks must be an integer >= 1, got {last_blocks}.")
        if num_classes is not None:
            check_range(num_classes, "num_classes", 2)
        self.last_blocks, self.batch_norm, self.num_classes = int(last_blocks), bool(batch_norm), num_classes
        self._classes = num_classes

    @property
    def blocks_needed(self) -> int:
        return self.last_blocks

    def grids(self, ctx: EvalContext, width: int):
        grid = SegmentationHeadGrid(
            self.last_blocks * width,
            self._classes,
            len(self.points),
            ctx.encoder.token_grid,
            batch_norm=self.batch_norm,
            seed=ctx.seed,
        )
        return [("", {"last_blocks": self.last_blocks, "batch_norm": self.batch_norm}, grid)]

    def grid_input(self, settings: dict, features: torch.Tensor) -> torch.Tensor:
        return features

    def classes(self, ctx: EvalContext) -> int:
        """The heads' classes: ``num_classes``, or 1 + the largest class id of the train split's masks."""
        found = ctx.num_classes
        if self.num_classes is None:
            if found < 2:
                raise ValueError(f"{self.name}: the train split's masks hold one class only: nothing to segment.")
            return found
        if found > self.num_classes:
            raise ValueError(
                f"num_classes={self.num_classes}, but the train split's masks hold class {found - 1}: raise num_classes "
                "or leave it null (1 + the largest class id)."
            )
        return self.num_classes

    def ignore_unknown_labels(
        self, ctx: EvalContext, masks: torch.Tensor, kind: str, blocks: int
    ) -> tuple[torch.Tensor, dict[str, int]]:
        """The test split's ``masks`` with the pixels of a label outside the heads' classes (``0 ..
        num_classes - 1``: the training labels, or the declared ``num_classes``) set to
        :data:`~ijepa.data.batch.IGNORE_INDEX`, as mmsegmentation ignores them (``ignore_index``
        255: they count nowhere), so that the scores have one IoU per class the heads know; and
        ``{label: pixels}`` of those labels. One warning names the mask files and their labels."""
        stray = (masks != IGNORE_INDEX) & (masks.long() >= self._classes)
        if not stray.any():
            return masks, {}
        rows = stray.flatten(1).any(1).nonzero().flatten()
        positions = ctx.positions("test", kind, blocks)
        files = []
        for row in rows.tolist():
            labels, pixels = masks[row][stray[row]].long().unique(return_counts=True)
            found = ", ".join(
                f"label {label} ({count} pixels)" for label, count in zip(labels.tolist(), pixels.tolist())
            )
            files.append(f"{ctx.mask_file('test', int(positions[row]))}: {found}")
        labels, pixels = masks[stray].long().unique(return_counts=True)
        ignored = {str(label): count for label, count in zip(labels.tolist(), pixels.tolist())}
        shown = "; ".join(files[:5]) + (f"; and {len(files) - 5} more" if len(files) > 5 else "")
        known = (
            f"num_classes={self.num_classes}"
            if self.num_classes is not None
            else "1 + the largest class id of the train split's masks"
        )
        ctx.warn(
            f"{self.name}: {len(files)} test mask(s) hold label(s) {sorted(map(int, ignored))} outside the classes "
            f"0..{self._classes - 1} ({known}); their {sum(ignored.values())} pixels are ignored, as mmsegmentation "
            f"ignores them (ignore_index {IGNORE_INDEX}): {shown}. Fix those masks (then evaluate with --cache false: "
            "the feature cache holds the masks as read), or set num_classes to score such labels as classes."
        )
        return masks.masked_fill(stray, IGNORE_INDEX), ignored

    def evaluate(self, ctx: EvalContext) -> dict:
        if self.last_blocks > ctx.encoder.depth:
            raise ValueError(
                f"last_blocks must be in 1..{ctx.encoder.depth} (the encoder's depth), got {self.last_blocks}."
            )
        view = ctx.with_target("masks", f"{self.name} (segmentation)")
        kind, blocks = self.feature_kind, self.last_blocks
        batch_size = self.batch_size or ctx.data.batch_size
        x_train, m_train, x_val, m_val = self.grid_splits(view)
        self._classes = self.classes(view)
        grids, total = self.train_grids(view, x_val.size(-1) // blocks, x_train, m_train)
        (_, settings, grid) = grids[0]
        confusions = grid_confusions(grid, x_val, m_val, self._classes, batch_size)
        heads = []
        for (lr, wd), confusion in zip(self.points, confusions):
            scores = segmentation_scores(confusion)
            name = f"lr={lr:g},wd={wd:g}"
            heads.append(
                {
                    "name": name,
                    "settings": {**settings, "lr": lr, "weight_decay": wd},
                    "val_miou": scores["miou"],
                    "val_pixel_accuracy": scores["pixel_accuracy"],
                }
            )
            ctx.log({f"{self.name}/val_miou/{name}": scores["miou"]}, total)
        best = select(heads, "val_miou")
        index = heads.index(best)
        x_test, m_test = view.features("test", kind, blocks)  # read once the head is chosen
        m_test, ignored = self.ignore_unknown_labels(view, m_test, kind, blocks)
        test = segmentation_scores(grid_confusions(grid, x_test, m_test, self._classes, batch_size, heads=[index])[0])
        ceiling = token_grid_ceiling(m_test, view.encoder.token_grid, self._classes, batch_size=batch_size)["miou"]
        ctx.log(
            {
                f"{self.name}/test_miou": test["miou"],
                f"{self.name}/test_pixel_accuracy": test["pixel_accuracy"],
                f"{self.name}/ceiling_miou": ceiling,
            }
        )
        return {
            "heads": heads,
            "selected": best["name"],
            "val_miou": best["val_miou"],
            "val_pixel_accuracy": best["val_pixel_accuracy"],
            "test_miou": test["miou"],
            "test_pixel_accuracy": test["pixel_accuracy"],
            "test_iou": test["iou"],
            "ceiling_miou": ceiling,
            "num_classes": self._classes,
            "ignored_test_labels": ignored,
            "steps": total,
        }


class CountingProtocol(Protocol):
    """Object counting from frozen features (the I-JEPA paper's Clevr/Count): each image's number
    of objects is its class (the distinct counts of the train split, ascending:
    ``count_classes``; a test count the train split lacks is always wrong), predicted by a grid
    of linear heads on the pooled features and a grid of attentive heads on every token, trained
    on cached features (a random crop would change the count). Each grid selects its head on
    validation (``probes``: its selected head, validation and test top-1); the results' own
    ``selected`` / ``test_top1`` are the best head over both.

    Args:
        probes: which grids to train: ``linear``, ``attentive`` or both.
        linear: options of the linear grid (:class:`~ijepa.evaluation.LinearProtocol`'s, but
            ``augment``), e.g. ``{lrs: [...], last_blocks: [1, 4]}``; null: its defaults.
        attentive: options of the attentive grid (:class:`~ijepa.evaluation.AttentiveProtocol`'s,
            but ``augment``); null: its defaults.
        name: the results' name (default ``counting``).
    """

    kind = "counting"
    reads = "counts"
    PROBES = {"linear": LinearProtocol, "attentive": AttentiveProtocol}

    def __init__(
        self,
        probes: list[str] = ("linear", "attentive"),
        linear: dict | None = None,
        attentive: dict | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        probes = list(probes)
        if not probes or len(set(probes)) != len(probes) or not set(probes) <= set(self.PROBES):
            raise ValueError(
                f"probes must name each of {sorted(self.PROBES)} at most once (at least one), got {probes}."
            )
        self.probes = probes
        options = {"linear": dict(linear or {}), "attentive": dict(attentive or {})}
        self._probes = {}
        for probe in probes:
            if options[probe].get("augment"):
                raise ValueError(
                    f"{probe}: augment must be false for counting: a random crop changes an image's number of objects."
                )
            settings = {**options[probe], "augment": False, "name": f"{self.name}/{probe}"}
            try:
                self._probes[probe] = self.PROBES[probe](**settings)
            except TypeError as error:
                raise ValueError(f"{probe}: {error}") from error

    def settings(self) -> dict:
        return {"name": self.name, "probes": self.probes, **{p: proto.settings() for p, proto in self._probes.items()}}

    def evaluate(self, ctx: EvalContext) -> dict:
        view = ctx.with_target("counts", f"{self.name} (counting)")
        heads, probes = [], {}
        for probe, protocol in self._probes.items():
            found = protocol.evaluate(view)
            for head in found["heads"]:
                heads.append(
                    {**head, "name": f"{probe}/{head['name']}", "settings": {"probe": probe, **head["settings"]}}
                )
            probes[probe] = {
                "selected": f"{probe}/{found['selected']}",
                "val_top1": found["val_top1"],
                "test_top1": found["test_top1"],
                "steps": found["steps"],
            }
            ctx.log({f"{self.name}/{probe}/test_top1": found["test_top1"]})
        best = select(heads)
        return {
            "heads": heads,
            "selected": best["name"],
            "val_top1": best["val_top1"],
            "test_top1": probes[best["settings"]["probe"]]["test_top1"],
            "probes": probes,
            "count_classes": view.count_classes.tolist(),
        }

    def edges(self, result: dict) -> list[tuple[str, float, str]]:
        """Each grid's selected head at an end of that grid's sweeps."""
        return [
            edge
            for probe, found in result["probes"].items()
            for edge in grid_edges(
                [head for head in result["heads"] if head["settings"]["probe"] == probe], found["selected"]
            )
        ]
