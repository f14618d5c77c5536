"""``FineTuner``: an encoder and a classification head trained end to end on labels.

The encoder comes as ``ijepa eval`` opens it (:func:`ijepa.evaluation.encoders.open_encoder`:
an ``ijepa fit`` or ``distill`` checkpoint, target or online encoder, a converted official
checkpoint, a Hugging Face folder), adapted to the data's image size, or ``random``: the
architecture's fresh initialisation, the from-scratch baseline. One step is a forward pass of
(mixed) images, soft-target cross-entropy, AdamW with layer-wise lr decay; stochastic depth,
freezing and LoRA change which weights move and how. The checkpoint holds the network's own
description (``network``), so it loads back without the file it started from.
"""

from __future__ import annotations

import copy
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from ijepa.checkpoint import restore_rng_states, rng_states
from ijepa.evaluation.encoders import RANDOM, architecture_options, open_encoder
from ijepa.finetune.heads import HeadKind, head_from_config
from ijepa.finetune.lora import LoraOptions, add_lora, has_lora, merge_lora
from ijepa.finetune.recipe import FinetuneOptim, build_optimizer, freeze_all_but_last, set_drop_path
from ijepa.nn.stem import ConvStem
from ijepa.nn.vit import VisionTransformer, init_timm

# How ``checkpoint: random`` initialises the encoder (``model.init``): timm's standard ViT init, the
# fair from-scratch baseline, or I-JEPA's (the weights ``ijepa fit`` starts from: trunc-normal 0.02
# everywhere, residual projections rescaled), which trains worse from labels alone (docs/finetuning.md).
SCRATCH_INITS = {"timm": init_timm, "ijepa": None}

# the architecture options a checkpoint must agree with (image size is adapted, not compared)
COMPARED = ("patch_size", "embed_dim", "depth", "num_heads", "pos_embed", "stem", "in_channels")


def network_spec(network: VisionTransformer) -> dict:
    """Plain values that rebuild ``network``'s architecture (:func:`build_network`)."""
    if network.is_clip_encoder:
        raise ValueError("ijepa finetune trains image encoders; this checkpoint holds a clip encoder.")
    embed, first = network.patch_embed, network.transformer.blocks[0]
    conv = isinstance(embed, ConvStem)
    return {
        "image_size": embed.image_size,
        "patch_size": embed.patch_size,
        "in_channels": embed.in_channels if conv else embed.proj.in_channels,
        "embed_dim": network.embed_dim,
        "depth": len(network.transformer.blocks),
        "num_heads": first.attn.num_heads,
        "mlp_ratio": first.mlp.fc1.out_features / network.embed_dim,
        "qkv_bias": first.attn.qkv.bias is not None,
        "pos_embed": network.position.name,
        "pos_options": dict(getattr(network.position, "_build_options", {})),
        "norm_eps": network.transformer.norm.eps,
        "stem": "conv" if conv else "patch",
    }


def build_network(spec: dict) -> VisionTransformer:
    """An encoder of ``spec`` (:func:`network_spec`); its weights are the init's until loaded."""
    return VisionTransformer.for_images(**spec, rescale_residuals=False)


def check_architecture(spec: dict, wanted: dict, checkpoint: str) -> None:
    """One line naming each option where ``checkpoint``'s encoder differs from ``model.architecture``."""
    differ = [key for key in COMPARED if key in wanted and wanted[key] != spec.get(key)]
    if differ:
        listed = ", ".join(f"{key}={wanted[key]} (checkpoint: {spec.get(key)})" for key in differ)
        raise ValueError(
            f"model.checkpoint={checkpoint!r} holds another architecture than model.architecture asks for: {listed}. "
            "Drop model.architecture to fine-tune the checkpoint's, or use a checkpoint of that architecture."
        )


class FineTuner(pl.LightningModule):
    """An encoder plus a head, fine-tuned on labels.

    Args:
        checkpoint: the encoder to start from: an ``ijepa fit`` / ``distill`` checkpoint, a
            converted official checkpoint (``ijepa convert ... ckpt``), a Hugging Face
            ``IJepaModel`` folder, or ``random`` (``architecture``'s fresh init: training from scratch).
        encoder: ``target`` (the EMA encoder) or ``online`` of an ijepa checkpoint.
        architecture: the encoder options (a dict, or an ``ijepa fit`` config's path) that
            ``random`` builds; with a checkpoint, a check that it holds this architecture.
        init: how ``random`` initialises the encoder (:data:`SCRATCH_INITS`): ``timm`` (timm's ViT
            init, the default: a fair scratch) or ``ijepa`` (the weights ``ijepa fit --seed_everything
            <seed>`` starts from); drawn from ``seed``. Ignored with a checkpoint.
        image_size: the images' side (set from ``data.image_size``); another size than the
            checkpoint's adapts its positions as ``ijepa eval`` does.
        num_classes: classes of the head; null: the data's (a value that disagrees is refused).
        head: the head kind (``class_path``: :class:`~ijepa.finetune.heads.MeanPoolHead`,
            :class:`~ijepa.finetune.heads.AttentivePoolHead`).
        drop_path_rate: stochastic depth of the last block (linear from 0 at the first).
        trainable_blocks: train only the last k blocks, the final norm and the head (the
            embedding and positions frozen; 0: the head alone); null: everything trains.
        lora: LoRA options (:class:`~ijepa.finetune.lora.LoraOptions`: rank, alpha, dropout,
            targets; needs ``peft``): the encoder frozen, its adapters and the head train.
        optim: :class:`~ijepa.finetune.recipe.FinetuneOptim` (lr, layer_decay, warm-up, ...).
        seed: seed of a ``random`` encoder and of the head's initialisation.
        compile: run the encoder and head under ``torch.compile`` (``nn.Module.compile``: the
            state dict keeps its names), as ``model.compile`` does in pretraining.
    """

    def __init__(
        self,
        checkpoint: str | None = RANDOM,
        encoder: str = "target",
        architecture: dict | str | None = None,
        init: str = "timm",
        image_size: int | None = None,
        num_classes: int | None = None,
        head: HeadKind | None = None,
        drop_path_rate: float = 0.1,
        trainable_blocks: int | None = None,
        lora: LoraOptions | dict | None = None,
        optim: FinetuneOptim | dict | None = None,
        seed: int = 0,
        network: dict | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.head_kind = head_from_config(copy.deepcopy(head))
        self.optim = FinetuneOptim.of(optim)
        self.lora_options = LoraOptions.of(lora)
        if lora is not None and trainable_blocks is not None:
            raise ValueError(
                "model.lora and model.trainable_blocks exclude each other: LoRA freezes the whole encoder."
            )
        if init not in SCRATCH_INITS:
            raise ValueError(f"model.init must be one of {', '.join(SCRATCH_INITS)}, got {init!r}.")
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"model.num_classes must be >= 2 (or null: the data's), got {num_classes}.")
        self.save_hyperparameters(ignore=["head", "optim", "lora", "network"])
        self.hparams.update(
            head=self.head_kind.config(),
            optim=self.optim.record(),
            lora=None if self.lora_options is None else self.lora_options.record(),
        )
        if checkpoint is None and network is None:
            raise ValueError(
                "model.checkpoint is required: an ijepa checkpoint, a Hugging Face folder, or random (from scratch)."
            )
        if network is not None:  # a fine-tuned checkpoint read back: its own architecture
            self.encoder = build_network(network)
        else:
            self.encoder = self.open(checkpoint, encoder, architecture, image_size, seed, init)
        self.hparams["network"] = network_spec(self.encoder)
        self.encoder.requires_grad_(True)
        set_drop_path(self.encoder, drop_path_rate)
        freeze_all_but_last(self.encoder, trainable_blocks)
        if self.lora_options is not None:
            add_lora(self.encoder, self.lora_options)
        self.head: nn.Module | None = None
        if num_classes is not None:
            self.build_head(num_classes)
        if compile:
            self.encoder.compile()

    @staticmethod
    def open(checkpoint, encoder, architecture, image_size, seed, init="ijepa") -> VisionTransformer:
        opened, _ = open_encoder(
            checkpoint, encoder, image_size=image_size, architecture=architecture, seed=seed,
            architecture_flag="--model.architecture",
        )  # fmt: skip
        network = opened.network
        if checkpoint == RANDOM and SCRATCH_INITS[init] is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                SCRATCH_INITS[init](network)
        if checkpoint != RANDOM and architecture is not None:
            check_architecture(network_spec(network), architecture_options(architecture), checkpoint)
        network.train()
        network.transformer.checkpoint_every = 0
        return network

    def build_head(self, num_classes: int) -> None:
        self.hparams["num_classes"] = num_classes
        self.head = self.head_kind.build(self.encoder.embed_dim, num_classes, self.hparams.seed)
        if self.hparams.get("compile"):
            self.head.compile()
        top5 = min(5, num_classes)
        self.metrics = nn.ModuleDict(
            {
                f"{split}_{name}": MulticlassAccuracy(num_classes, top_k=k, average="micro")
                for split in ("val", "test")
                for name, k in (("top1", 1), (f"top{top5}", top5))
            }
        )

    @property
    def depth(self) -> int:
        return len(self.encoder.transformer.blocks)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        classes = getattr(datamodule, "num_classes", None)
        if datamodule is not None and classes is None and hasattr(datamodule, "setup"):
            datamodule.setup(stage)
            classes = datamodule.num_classes
        if classes is None:
            if self.head is None:
                raise ValueError("model.num_classes is null and the data names no class count: set model.num_classes.")
            return
        if self.head is None:
            self.build_head(classes)
        elif self.hparams.num_classes != classes:
            raise ValueError(
                f"model.num_classes={self.hparams.num_classes} disagrees with the data, which has {classes} classes: "
                "set model.num_classes to it (or null: the data's)."
            )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W] -> logits [B, C]``."""
        return self.head(self.encoder(images))

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch  # soft targets [B, C]: mixed and smoothed by the collate
        loss = F.cross_entropy(self(images), targets)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[-1]["lr"])
        return loss

    def _score(self, batch, split: str) -> None:
        images, labels = batch
        logits = self(images)
        self.log(f"{split}/loss", F.cross_entropy(logits, labels), sync_dist=True)
        for name, metric in self.metrics.items():
            if name.startswith(split):
                metric.update(logits, labels)
                self.log(f"{split}/{name.split('_', 1)[1]}", metric, prog_bar=name.endswith("top1"))

    def validation_step(self, batch, batch_idx: int) -> None:
        self._score(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._score(batch, "test")

    def configure_optimizers(self):
        optimizer = build_optimizer(self, self.depth, self.optim, self.device)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.optim.factor_at(step, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng_states()  # stochastic depth draws from the global RNG

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.head is None and checkpoint["hyper_parameters"].get("num_classes"):
            self.build_head(checkpoint["hyper_parameters"]["num_classes"])
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        restore_rng_states(checkpoint.get("rng_states") if fitting else None)

    def merged(self) -> FineTuner:
        """This model with any LoRA adapters folded into the encoder's weights (in place)."""
        if has_lora(self.encoder):
            merge_lora(self.encoder)
            self.hparams["lora"] = None
        return self


def load_finetuned(path: str | Path, merge: bool = True) -> FineTuner:
    """A fine-tuned checkpoint read back on the CPU in eval mode (LoRA merged unless ``merge`` is False)."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    hparams = saved.get("hyper_parameters") if isinstance(saved, dict) else None
    if not isinstance(hparams, dict) or "network" not in hparams or "head" not in hparams:
        raise ValueError(f"{path} is not a checkpoint of ijepa finetune (no network and head in its hyperparameters).")
    model = FineTuner(**{key: value for key, value in hparams.items() if not key.startswith("_")})
    model.load_state_dict(saved["state_dict"])
    model = model.merged() if merge else model
    return model.eval().requires_grad_(False)
