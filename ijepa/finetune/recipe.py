"""MAE / BEiT fine-tuning's optimiser recipe on an encoder: layer-wise learning-rate decay, the
no-decay set, stochastic depth per block, and freezing all but the last blocks.

Plain functions over a :class:`~ijepa.nn.vit.VisionTransformer` (no Lightning), so that a test
or a benchmark can call each alone. Layer ids follow MAE's ``param_groups_lrd``: the patch
embedding and the position tables are layer 0, block ``i`` (0-based) is layer ``i + 1``, the final
norm and the head are layer ``depth + 1``; layer ``l``'s learning rate is ``lr x decay^(depth + 1
- l)``, so block ``i`` trains at ``lr x decay^(depth - i)`` and the embedding at the deepest decay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ijepa.nn.checks import check_range
from ijepa.optim import parameter_groups
from ijepa.schedules import warmup_cosine_schedule


@dataclass(frozen=True)
class FinetuneOptim:
    """``model.optim`` of ``ijepa finetune``: AdamW with layer-wise lr decay, linear warm-up then
    cosine decay of the learning rate, constant weight decay (MAE's fine-tuning recipe).

    Args:
        lr: peak learning rate of the head (the top layer); block ``i`` gets ``lr x
            layer_decay^(depth - i)``. MAE states a base lr per 256 images: ``lr = blr x batch / 256``.
        start_lr: learning rate at step 0 (linear warm-up from it; at most ``lr``).
        final_lr: learning rate at the last step (cosine decay to it; at most ``lr``).
        warmup_steps: optimizer steps of linear warm-up.
        weight_decay: AdamW weight decay (not on biases, norms, position tables).
        layer_decay: layer-wise lr decay in (0, 1]; 1 trains every layer at ``lr``.
        betas: AdamW betas, each in [0, 1).
    """

    lr: float = 1e-3
    start_lr: float = 0.0
    final_lr: float = 1e-6
    warmup_steps: int = 100
    weight_decay: float = 0.05
    layer_decay: float = 0.75
    betas: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self):
        for name in ("lr", "start_lr", "final_lr", "warmup_steps", "weight_decay"):
            check_range(getattr(self, name), f"model.optim.{name}", 0)
        check_range(self.layer_decay, "model.optim.layer_decay", 0, 1, low_open=True)
        if len(self.betas) != 2:
            raise ValueError(f"model.optim.betas must be two values, got {list(self.betas)}.")
        for index, beta in enumerate(self.betas):
            check_range(beta, f"model.optim.betas[{index}]", 0, 1, high_open=True)
        object.__setattr__(self, "betas", tuple(float(beta) for beta in self.betas))
        for name in ("start_lr", "final_lr"):
            if getattr(self, name) > self.lr:
                raise ValueError(f"model.optim.{name} must be <= model.optim.lr={self.lr}, got {getattr(self, name)}.")

    @classmethod
    def of(cls, value: FinetuneOptim | dict | None) -> FinetuneOptim:
        return cls() if value is None else value if isinstance(value, cls) else cls(**value)

    def record(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}

    def factor_at(self, step: int, total_steps: int) -> float:
        """The schedule's learning rate at ``step`` divided by ``lr`` (each group's multiplier)."""
        total = max(total_steps, 1)
        lr = warmup_cosine_schedule(step, total, min(self.warmup_steps, total), self.lr, self.final_lr, self.start_lr)
        return lr / self.lr if self.lr > 0 else 0.0


def layer_id(name: str, depth: int) -> int:
    """MAE's layer id of an encoder parameter named as in :class:`VisionTransformer`'s state dict
    (``patch_embed.*``, ``transformer.position.*``: 0; ``transformer.blocks.i.*``: ``i + 1``;
    anything else, the final norm and the head: ``depth + 1``). A prefix before these names (``encoder.``,
    LoRA's wrappers) is ignored."""
    parts = name.split(".")
    if "patch_embed" in parts or ("transformer" in parts and parts[parts.index("transformer") + 1] == "position"):
        return 0
    if "blocks" in parts and "transformer" in parts:
        return int(parts[parts.index("blocks") + 1]) + 1
    return depth + 1


def lr_scale(name: str, depth: int, layer_decay: float) -> float:
    """``layer_decay^(depth + 1 - layer_id(name))``: the share of the peak lr ``name`` trains at."""
    return layer_decay ** (depth + 1 - layer_id(name, depth))


def layer_decay_groups(
    model: nn.Module, depth: int, layer_decay: float, weight_decay: float, encoder_prefix: str = "encoder."
) -> list[dict]:
    """AdamW parameter groups of ``model``'s trainable parameters: one per (layer, with or
    without weight decay), each ``{"params", "names", "lr_scale", "weight_decay", "layer"}``.
    Parameters under ``encoder_prefix`` get their layer's scale; the rest (the head) the top
    layer's, 1. No weight decay on biases, norms and what a module lists in ``no_weight_decay()``
    (position tables), as :func:`ijepa.optim.parameter_groups` decides for pretraining."""
    params = dict(model.named_parameters())
    decay, no_decay = parameter_groups(model)
    groups: dict[tuple[int, bool], dict] = {}
    for names, decayed in ((decay, True), (no_decay, False)):
        for name in names:
            layer = layer_id(name, depth) if name.startswith(encoder_prefix) else depth + 1
            group = groups.setdefault(
                (layer, decayed),
                {
                    "params": [],
                    "names": [],
                    "layer": layer,
                    "lr_scale": layer_decay ** (depth + 1 - layer),
                    "weight_decay": weight_decay if decayed else 0.0,
                },
            )
            group["params"].append(params[name])
            group["names"].append(name)
    return [groups[key] for key in sorted(groups)]


def build_optimizer(model: nn.Module, depth: int, optim: FinetuneOptim, device: torch.device) -> torch.optim.AdamW:
    """AdamW over :func:`layer_decay_groups`; each group's lr is ``optim.lr x lr_scale`` (the
    scheduler multiplies every group by the same schedule factor)."""
    groups = layer_decay_groups(model, depth, optim.layer_decay, optim.weight_decay)
    if not groups:
        raise ValueError("nothing to train: every parameter is frozen (model.trainable_blocks, model.lora).")
    for group in groups:
        group["lr"] = optim.lr * group["lr_scale"]
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, fused=fused, foreach=None if fused else True)


def drop_path_rates(depth: int, rate: float) -> list[float]:
    """Stochastic depth per block: linear from 0 at the first block to ``rate`` at the last."""
    check_range(rate, "model.drop_path_rate", 0, 1, high_open=True)
    return torch.linspace(0, rate, depth).tolist()


def set_drop_path(network: nn.Module, rate: float) -> None:
    """Give every block of ``network`` (a :class:`VisionTransformer`) its :func:`drop_path_rates`
    rate (a pretrained encoder is loaded with none; eval mode drops nothing)."""
    blocks = network.transformer.blocks
    for block, p in zip(blocks, drop_path_rates(len(blocks), rate)):
        block.drop_path.p = p


def freeze_all_but_last(network: nn.Module, trainable_blocks: int | None) -> None:
    """Freeze the embedding, the positions and every block but the last ``trainable_blocks``
    (None: nothing frozen; 0: the whole encoder, only the head trains). The final norm, after the
    last block, trains with it unless ``trainable_blocks`` is 0."""
    if trainable_blocks is None:
        return
    depth = len(network.transformer.blocks)
    check_range(trainable_blocks, "model.trainable_blocks", 0, depth)
    first = depth - trainable_blocks
    for name, param in network.named_parameters():
        layer = layer_id(name, depth)
        param.requires_grad_(layer > first if trainable_blocks else False)
