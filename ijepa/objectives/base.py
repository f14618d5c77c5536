"""The objective kind: a change to the JEPA step, chosen in YAML by ``class_path``
(``model.objectives``, a list; empty: I-JEPA's objective). A member overrides what it changes:
the targets (:meth:`Objective.target_blocks`), the context branch's input
(:meth:`Objective.context_view`), what the step records (:meth:`Objective.predicts_context`,
:meth:`Objective.needs_hidden`), the latent loss's weight (:meth:`Objective.latent_weight`) and
a term joining the loss (:meth:`Objective.add_to`); :meth:`Objective.build` gives it the
model's sizes for its own layers.
"""

from __future__ import annotations

import abc
import copy
import importlib

import torch
import torch.nn as nn

from ijepa.registry import class_path, concrete_subclasses, from_config
from ijepa.step import StepOutput, target_blocks


class Objective(nn.Module, metaclass=abc.ABCMeta):
    """A change to the JEPA step. Subclasses override what they change: :meth:`target_blocks`
    (which target-encoder blocks are the targets), :meth:`context_view` (the context branch's
    images), :meth:`predicts_context` / :meth:`needs_hidden` (what the step records),
    :meth:`latent_weight` (the JEPA loss's weight) and :meth:`add_to` (a term joining the loss);
    :meth:`build` makes its own layers once the model's sizes are known."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def config(self) -> dict:
        """``{"class_path", "init_args"}``: plain values that rebuild this member (checkpoints);
        a member the package exports is named by its public path (``ijepa.objectives.Recolour``),
        which stays when its file moves."""
        package = importlib.import_module("ijepa.objectives")
        public = getattr(package, type(self).__name__, None) is type(self)
        path = f"ijepa.objectives.{type(self).__name__}" if public else class_path(self)
        return {"class_path": path, "init_args": copy.deepcopy(self.options)}

    def build(self, model: nn.Module) -> None:
        """Make this member's layers for ``model`` (an :class:`~ijepa.module.IJEPA`, its encoders
        and predictor built); refuse a model it cannot serve. Default: nothing to build."""

    def context_view(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """The images ``[R * B, C, ...]`` (one copy per mask row) the context encoder sees; the
        target encoder always sees the batch's own. Default: unchanged."""
        return images

    def needs_hidden(self) -> bool:
        """Whether the step records the predictor's last hidden states (:attr:`StepOutput.predictor_hidden`)."""
        return False

    def latent_predictions(self, predictions: torch.Tensor) -> torch.Tensor:
        """The predictions ``[..., D']`` the latent loss reads (the step's record keeps the
        predictor's own). Default: unchanged."""
        return predictions

    def latent_weight(self) -> float:
        """The factor of the JEPA (latent) loss; 0 drops it from the graph (the predictor's output
        projection then gets no gradient). Members' factors multiply."""
        return 1.0

    def target_blocks(self, depth: int) -> list[int] | None:
        """The target-encoder blocks (1-based) whose outputs are the targets; None: no change."""
        return None

    def predicts_context(self, step: int) -> bool:
        """Whether the step at ``step`` needs :attr:`StepOutput.context_predictions`."""
        return False

    def grid_only(self) -> bool:
        """Whether this member changes the step (native-resolution packed batches refuse it then)."""
        return False

    @abc.abstractmethod
    def add_to(self, loss: torch.Tensor, out: StepOutput, step: int, loss_fn) -> tuple[torch.Tensor, dict]:
        """The loss with this objective's term joined, and ``{log name: value}`` to log;
        ``loss_fn(predictions, targets, reduction)`` is the module's prediction loss."""

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.options.items())


def objective_kinds() -> tuple[type[Objective], ...]:
    """The concrete objectives imported so far, in definition order (the CLI's and docs' registry)."""
    return concrete_subclasses(Objective)


def objective_from_config(config: dict | Objective) -> Objective:
    """The member an :meth:`Objective.config` dict describes (a member is returned as it is)."""
    return config if isinstance(config, Objective) else from_config(config, Objective)


def context_views(objectives, step: int):
    """The members' :meth:`Objective.context_view` in list order as one function of the
    repeated images, or None when no member changes the view (the step then repeats nothing extra)."""
    changing = [m for m in objectives if type(m).context_view is not Objective.context_view]
    if not changing:
        return None

    def view(images: torch.Tensor) -> torch.Tensor:
        for member in changing:
            images = member.context_view(images, step)
        return images

    return view


def latent_weight(objectives) -> float:
    """The JEPA loss's factor: the product of the members' :meth:`Objective.latent_weight`."""
    weight = 1.0
    for member in objectives:
        weight *= member.latent_weight()
    return weight


def latent_predictions(objectives, predictions: torch.Tensor) -> torch.Tensor:
    """``predictions`` through the members' :meth:`Objective.latent_predictions`, in list order."""
    for member in objectives:
        predictions = member.latent_predictions(predictions)
    return predictions


def refuse_packed(objectives, last_blocks: int) -> None:
    """Native-resolution batches take the last block's targets and no context loss."""
    if last_blocks != 1:
        raise ValueError("native-resolution batches take target_last_blocks=1 (the last block's output).")
    if any(member.grid_only() for member in objectives):
        raise ValueError(
            "native-resolution (packed) batches take no model.objectives that change the step: "
            + ", ".join(type(m).__name__ for m in objectives if m.grid_only())
            + "."
        )


def check_resumed_levels(checkpoint: dict, blocks: list[int], depth: int) -> None:
    """Refuse a checkpoint whose target levels (the predictor's output width) differ from ``blocks``."""
    saved = [objective_from_config(c) for c in (checkpoint.get("hyper_parameters") or {}).get("objectives") or ()]
    theirs = target_blocks(saved, depth)
    if len(theirs) != len(blocks):
        raise ValueError(
            f"the checkpoint predicts {len(theirs)} target level(s) (blocks {theirs}), this model {len(blocks)} "
            f"(blocks {blocks}): model.objectives' MultiLevelTargets levels fix the predictor's output width. Use "
            "the checkpoint's levels, or start a new run without ckpt_path."
        )
