"""The IJEPA LightningModule: online encoder, EMA target encoder, predictor, and one step's math."""

from __future__ import annotations

import contextlib
import copy
import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ijepa.checkpoint import non_finite_tensors, previous_path, resize_optimizer_states, resize_state_dict
from ijepa.nn.checks import check_range, index_checks
from ijepa.nn.packing import (
    Packed,
    canvas_positions,
    instance_norm_per_image,
    pack,
    pack_greedy,
    patchify,
    pooled_per_image,
)
from ijepa.nn.patch import gather_patches
from ijepa.nn.predictor import Predictor
from ijepa.nn.resize import INTERPOLATION_MODES
from ijepa.nn.sharding import data_parallel_mesh, is_sharded, shard_network
from ijepa.nn.video import VideoVisionTransformer, tubelet_times
from ijepa.nn.vit import VisionTransformer
from ijepa.regularizers import Projector, SIGReg, VarianceCovariance
from ijepa.schedules import cosine_schedule, warmup_cosine_schedule

LOSSES = ("smooth_l1", "mse")
SIGREG_INPUTS = ("tokens", "pooled", "both")
TARGET_NORMS = ("layer", "instance")


def normalize_targets(features: torch.Tensor, kind: str = "layer", eps: float = 1e-5) -> torch.Tensor:
    """Target features ``[B, N, D]`` normalised for the loss: ``layer`` over each token's ``D``
    features (I-JEPA), ``instance`` over each feature's ``N`` tokens of one image (data2vec), which
    removes what all of an image's patches share."""
    if kind == "layer":
        return F.layer_norm(features, features.shape[-1:], eps=eps)
    if kind == "instance":
        mean = features.mean(dim=1, keepdim=True)
        var = features.var(dim=1, unbiased=False, keepdim=True)
        return (features - mean) * torch.rsqrt(var + eps)
    raise ValueError(f"target_norm must be one of {TARGET_NORMS}, got {kind!r}.")


class IJEPA(L.LightningModule):
    """I-JEPA: predict the target encoder's features of masked blocks from a context block.

    One training step (shapes for batch ``B``, ``M`` target blocks of ``Kt`` patches, context of
    ``Kc`` patches, width ``D``):

    * target branch, no grad: ``target_encoder(images)`` on all patches ``[B, N, D]`` ->
      per-token layer norm -> gather the targets ``[B, M, Kt, D]``;
    * online branch: ``encoder(images, context_indices)`` ``[B, Kc, D]`` ->
      ``predictor(..., target_indices)`` ``[B, M, Kt, D]``;
    * loss: smooth L1 (or MSE) between the two, optionally mixed with a collapse regulariser on the
      context encoder's output, ``(1 - w) * jepa + w * sigreg``; the target encoder follows the
      online encoder by EMA in :class:`ijepa.callbacks.EMATargetUpdate`, never by gradient.

    A batch may carry ``context_mask [B, Kc]`` (True for real context tokens) when contexts of
    different lengths are padded (``data.context_policy: pad``).

    The schedules follow the official I-JEPA recipe: AdamW with linear warm-up then cosine
    learning rate (``start_lr -> lr -> final_lr``) and a cosine weight-decay schedule
    (``weight_decay -> final_weight_decay``), all functions of ``global_step``.

    Args:
        image_size: input side in pixels (linked from ``data.image_size`` by the CLI).
        patch_size: patch side in pixels; ``image_size`` must be a multiple of it.
        in_channels: image channels.
        embed_dim: encoder width.
        depth: encoder blocks.
        num_heads: encoder attention heads (must divide ``embed_dim``).
        mlp_ratio: MLP hidden width as a multiple of the block width.
        drop_path_rate: stochastic-depth rate of the last block (linear from 0), encoder and predictor.
        pos_embed: encoder position encoding, a name of ``ijepa.nn.position.POSITION_ENCODINGS``:
            none, learned, learned_2d, sincos, rope_axial, rope_mixed, peg or relative_bias for
            images; sincos_3d, learned_3d or mrope for clips (``docs/position_embeddings.md``).
        pos_options: the encoder position encoding's own options, e.g. ``{axis_order: row_col}``
            for sincos or ``{base: 10000}`` for rope_axial (the table in
            ``docs/position_embeddings.md`` lists each member's).
        predictor_embed_dim: predictor width.
        predictor_depth: predictor blocks.
        predictor_num_heads: predictor attention heads.
        predictor_pos_embed: predictor position encoding (same names as ``pos_embed``).
        predictor_pos_options: the predictor position encoding's own options.
        predictor_mode: per_block (official: one sequence per target block, context repeated) or
            one_pass (the context's layers run once per image and attend to the context only;
            each block's queries attend to the context and their own block; computed without an
            attention mask; less work per step, different math: ``docs/benchmarks.md``).
        loss: smooth_l1 (I-JEPA) or mse, on layer-normed target features.
        target_last_blocks: targets are the average of the last n target-encoder blocks' outputs,
            each normalised by ``target_norm`` (data2vec-style; 1 is I-JEPA's last block only).
        target_norm: how each target block is normalised before the loss: ``layer`` (I-JEPA: each
            token over its features) or ``instance`` (data2vec: each feature over the image's
            tokens, so what every patch of an image shares, e.g. its background, is not a target).
        sigreg_weight: weight ``w`` of LeJEPA's SIGReg (:class:`ijepa.regularizers.SIGReg`) in
            ``(1 - w) * jepa + w * sigreg``; 0 switches it off.
        sigreg_input: what SIGReg sees: ``tokens`` (a random sample of ``sigreg_tokens`` context
            tokens of the batch), ``pooled`` (each image's mean context token), or ``both`` (the
            mean of the two statistics).
        sigreg_tokens: context tokens per step that SIGReg sees with ``sigreg_input=tokens``.
        sigreg_slices: random 1-D projections SIGReg draws per step.
        sigreg_projector: widths of an MLP (:class:`ijepa.regularizers.Projector`) between the
            context tokens and SIGReg, e.g. ``[512, 128]``; null (default) applies SIGReg to the
            encoder's output itself.
        sigreg_projector_share: with a projector, the share of the SIGReg term measured on the
            projector's output; the rest is measured on the tokens themselves (1: all behind
            the projector).
        varcov_weight: weight ``v`` of VICReg's variance and covariance terms
            (:class:`ijepa.regularizers.VarianceCovariance`, C-JEPA's lever), measured on what
            ``varcov_input`` names and added as ``+ v * varcov``; 0 switches it off.
        varcov_input: what the variance-covariance terms see, as ``sigreg_input``: ``tokens`` (the
            sampled context tokens), ``pooled`` (each image's mean context token, C-JEPA's choice)
            or ``both`` (the mean of the two).
        rescale_residuals: divide each block's residual output projections by ``sqrt(2 * layer)``
            at init (the I-JEPA ViT's constructor); false starts as official I-JEPA training does,
            whose ``init_model`` redraws every Linear after that rescale.
        lr: peak learning rate, reached after ``warmup_steps``.
        start_lr: learning rate at step 0 (linear warm-up from it).
        final_lr: learning rate at the last step (cosine decay to it).
        warmup_steps: optimizer steps of linear warm-up.
        weight_decay: AdamW weight decay at step 0 (not on biases, norms, position tables, mask token).
        final_weight_decay: weight decay at the last step (cosine schedule).
        betas: AdamW betas.
        num_frames: 0 for images; for clips ``[B, C, T, H, W]`` the frames per clip, with a tubelet
            encoder and a video ``pos_embed`` / ``predictor_pos_embed`` (sincos_3d, learned_3d,
            mrope); see ``docs/video.md``. A clip batch may carry ``frame_times [B, T]`` in seconds.
        tubelet_size: frames per tubelet (clips only).
        time_unit: clips with timestamps: seconds per temporal position. The encoders and the
            predictor receive ``frame_time / time_unit`` (per tubelet), which encodings that read
            time (``mrope``) use as the temporal coordinate. Set it near the spacing of
            temporal tokens (``tubelet_size / clip_fps``) so timestamps rotate as much as frame
            indices would; at 1 s a 0.1 s gap barely rotates anything.
        compile: wrap the encoders and predictor in ``torch.compile`` (state-dict keys unchanged).
        compile_options: keyword arguments of that ``torch.compile`` (default ``{dynamic: true}``,
            for masks whose token counts change per batch). With ``data.context_policy: static``
            every batch has the same shapes: ``{dynamic: false, mode: reduce-overhead}`` captures
            the step once (CUDA graphs on a GPU).
        activation_checkpointing: 0 (off), or n: every n-th block of the online encoder and the
            predictor (1: every block) keeps only its input for the backward pass and recomputes
            its activations there, trading compute for the memory of those activations. The
            target encoder needs none (no backward). Losses and gradients are unchanged.
        debug_checks: run the host-syncing index range checks inside every step (off: the
            indices come from the mask sampler and the collator checks them on the CPU).
    """

    # Arguments that fix the parameters' shapes or meaning: a resumed run cannot change them
    # (the CLI reports a conflict); every other argument may differ from the checkpoint's.
    ARCHITECTURE = (
        "in_channels",
        "embed_dim",
        "depth",
        "num_heads",
        "mlp_ratio",
        "pos_embed",
        "pos_options",
        "predictor_embed_dim",
        "predictor_depth",
        "predictor_num_heads",
        "predictor_pos_embed",
        "predictor_pos_options",
        "predictor_mode",
        "tubelet_size",
        "sigreg_projector",
    )

    def __init__(
        self,
        image_size: int = 96,
        patch_size: int = 8,
        in_channels: int = 3,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
        pos_embed: str = "sincos",
        pos_options: dict | None = None,
        predictor_embed_dim: int = 96,
        predictor_depth: int = 6,
        predictor_num_heads: int = 3,
        predictor_pos_embed: str = "sincos",
        predictor_pos_options: dict | None = None,
        predictor_mode: str = "per_block",
        loss: str = "smooth_l1",
        target_last_blocks: int = 1,
        target_norm: str = "layer",
        sigreg_weight: float = 0.0,
        sigreg_input: str = "tokens",
        sigreg_tokens: int = 1024,
        sigreg_slices: int = 256,
        sigreg_projector: list[int] | None = None,
        sigreg_projector_share: float = 1.0,
        varcov_weight: float = 0.0,
        varcov_input: str = "tokens",
        rescale_residuals: bool = True,
        lr: float = 1e-3,
        start_lr: float = 2e-4,
        final_lr: float = 1e-6,
        warmup_steps: int = 1000,
        weight_decay: float = 0.04,
        final_weight_decay: float = 0.4,
        betas: tuple[float, float] = (0.9, 0.999),
        num_frames: int = 0,
        tubelet_size: int = 2,
        time_unit: float = 1.0,
        compile: bool = False,
        compile_options: dict | None = None,
        activation_checkpointing: int = 0,
        debug_checks: bool = False,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
        # Every numeric option is checked here, before any weight is built (a bad one used to fail
        # inside torch, e.g. drop_path_rate 1.5 at the first training step).
        for name, value, low in (
            ("image_size", image_size, 1),
            ("patch_size", patch_size, 1),
            ("in_channels", in_channels, 1),
            ("embed_dim", embed_dim, 1),
            ("depth", depth, 1),
            ("num_heads", num_heads, 1),
            ("predictor_embed_dim", predictor_embed_dim, 1),
            ("predictor_depth", predictor_depth, 1),
            ("predictor_num_heads", predictor_num_heads, 1),
            ("sigreg_tokens", sigreg_tokens, 2),
            ("sigreg_slices", sigreg_slices, 1),
            ("varcov_weight", varcov_weight, 0),
            ("lr", lr, 0),
            ("start_lr", start_lr, 0),
            ("final_lr", final_lr, 0),
            ("warmup_steps", warmup_steps, 0),
            ("weight_decay", weight_decay, 0),
            ("final_weight_decay", final_weight_decay, 0),
            ("tubelet_size", tubelet_size, 1),
            ("activation_checkpointing", activation_checkpointing, 0),
        ):
            check_range(value, name, low)
        check_range(mlp_ratio, "mlp_ratio", 0, low_open=True)
        check_range(drop_path_rate, "drop_path_rate", 0, 1, high_open=True)
        check_range(sigreg_weight, "sigreg_weight", 0, 1)
        check_range(sigreg_projector_share, "sigreg_projector_share", 0, 1)
        check_range(time_unit, "time_unit", 0, low_open=True)
        for index, beta in enumerate(betas):
            check_range(beta, f"betas[{index}]", 0, 1, high_open=True)
        for width in sigreg_projector or ():
            check_range(width, "sigreg_projector widths", 1)
        if not 1 <= target_last_blocks <= depth:
            raise ValueError(f"target_last_blocks must be in [1, {depth}] (the depth), got {target_last_blocks}.")
        if target_norm not in TARGET_NORMS:
            raise ValueError(f"target_norm must be one of {TARGET_NORMS}, got {target_norm!r}.")
        if sigreg_input not in SIGREG_INPUTS:
            raise ValueError(f"sigreg_input must be one of {SIGREG_INPUTS}, got {sigreg_input!r}.")
        if varcov_input not in SIGREG_INPUTS:
            raise ValueError(f"varcov_input must be one of {SIGREG_INPUTS}, got {varcov_input!r}.")
        self.save_hyperparameters()
        # How checkpoints from another resolution are adapted on load; the
        # PositionEmbeddingInterpolation callback sets these from the config.
        self.position_interpolation = {"mode": "bicubic", "antialias": False}
        if num_frames < 0:
            raise ValueError(f"num_frames must be 0 (images) or a positive frame count, got {num_frames}.")
        if num_frames:
            self.encoder = VideoVisionTransformer(
                num_frames,
                image_size,
                tubelet_size,
                patch_size,
                in_channels,
                embed_dim,
                depth,
                num_heads,
                mlp_ratio,
                drop_path_rate=drop_path_rate,
                pos_embed=pos_embed,
                rescale_residuals=rescale_residuals,
                pos_options=pos_options,
            )
            grid = self.encoder.grid
        else:
            self.encoder = VisionTransformer(
                image_size,
                patch_size,
                in_channels,
                embed_dim,
                depth,
                num_heads,
                mlp_ratio,
                drop_path_rate=drop_path_rate,
                pos_embed=pos_embed,
                rescale_residuals=rescale_residuals,
                pos_options=pos_options,
            )
            grid = self.encoder.grid_size
        self.target_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
        self.predictor = Predictor(
            grid,
            embed_dim,
            predictor_embed_dim,
            predictor_depth,
            predictor_num_heads,
            mlp_ratio,
            drop_path_rate=drop_path_rate,
            pos_embed=predictor_pos_embed,
            mode=predictor_mode,
            rescale_residuals=rescale_residuals,
            pos_options=predictor_pos_options,
        )
        for network in (self.encoder, self.predictor):  # the networks that have a backward pass
            network.transformer.checkpoint_every = activation_checkpointing
        self.sigreg = SIGReg(sigreg_slices) if sigreg_weight > 0 else None
        self.varcov = VarianceCovariance() if varcov_weight > 0 else None
        self.sigreg_projector = (
            Projector(embed_dim, sigreg_projector) if sigreg_weight > 0 and sigreg_projector else None
        )

    def setup(self, stage: str) -> None:
        # Denormal floats (below 1e-38, e.g. in AdamW's second moments) are very slow on CPU;
        # flushing them to zero only changes values that small. In an interleaved A/B of the
        # quickstart step the gain was within noise (docs/benchmarks.md); it guards long runs
        # whose moments decay.
        torch.set_flush_denormal(True)
        if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
            raise ValueError(
                "trainer.strategy: fsdp (Lightning's FSDPStrategy, FSDP1) flattens the online and target encoders "
                "into shards that do not line up, so the EMA update cannot pair them; use trainer.strategy: fsdp2 "
                "(ijepa.strategy.FSDP2Strategy: FSDP2, each encoder sharded alike). See README, Several GPUs."
            )

    def configure_model(self) -> None:
        mesh = self.device_mesh  # set by Lightning's ModelParallelStrategy (ijepa.strategy.FSDP2Strategy)
        if mesh is not None and not is_sharded(self.encoder):
            # Online and target encoders sharded alike, so the EMA runs shard by shard.
            data_parallel = data_parallel_mesh(mesh)
            for network in (self.encoder, self.target_encoder, self.predictor, self.sigreg_projector):
                if network is not None:
                    shard_network(network, data_parallel)
        if self.hparams.compile and not getattr(self, "_compiled", False):
            # nn.Module.compile compiles in place: parameters and state-dict keys stay as they are.
            options = {"dynamic": True, **(self.hparams.compile_options or {})}
            for network in (self.encoder, self.target_encoder, self.predictor):
                network.compile(**options)
            self._compiled = True

    def train(self, mode: bool = True) -> IJEPA:
        # The target encoder only ever runs in inference mode (no stochastic depth).
        super().train(mode)
        self.target_encoder.eval()
        return self

    @torch.no_grad()
    def features(
        self,
        images: torch.Tensor,
        encoder: str = "target",
        last_blocks: int = 1,
        frame_times: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean-pooled features of all patches, ``[B, C, H, W] -> [B, D]``, from the ``target``
        (default) or ``online`` encoder; with ``last_blocks=n`` the pooled, normed outputs of the
        last n blocks concatenated, ``[B, n*D]``. Clips ``[B, C, T, H, W]`` may come with
        ``frame_times [B, T]`` (seconds)."""
        network = self.target_encoder if encoder == "target" else self.encoder
        return network.pooled_features(images, last_blocks, **self.token_times(frame_times))

    @torch.no_grad()
    def token_features(
        self, images: torch.Tensor, encoder: str = "target", frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Every token's features through the encoder's final norm, ``[B, C, H, W] -> [B, N, D]``
        (clips ``[B, C, T, H, W]`` with optional ``frame_times [B, T]``), from the ``target``
        (default) or ``online`` encoder: what an attentive probe reads."""
        network = self.target_encoder if encoder == "target" else self.encoder
        return network(images, **self.token_times(frame_times))

    def token_times(self, frame_times: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """A clip batch's per-frame timestamps ``[B, T]`` (seconds) -> the keyword arguments the
        encoders and predictor take: ``{"frame_times": [B, T']}``, each tubelet's first frame in
        units of ``time_unit`` (temporal positions), or ``{}``."""
        if frame_times is None:
            return {}
        if not self.hparams.num_frames:
            raise ValueError("frame_times were given for an image model (model.num_frames=0).")
        return {"frame_times": tubelet_times(frame_times, self.hparams.tubelet_size) / self.hparams.time_unit}

    def step_patch_size(self, patch_size) -> dict[str, int]:
        """``{"patch_size": p}`` for a batch cut at another patch size than the model's (FlexiViT;
        ``patch_size`` an int or a 0-dim tensor from the collator), else ``{}``."""
        if patch_size is None or int(patch_size) == self.hparams.patch_size:
            return {}
        if self.hparams.num_frames:
            raise ValueError("per-batch patch sizes (data.train_patch_sizes) are for image models, not clips.")
        return {"patch_size": int(patch_size)}

    def forward(self, images: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """Target-encoder features of every patch, ``[B, C, H, W] -> [B, N, D]`` (clips
        ``[B, C, T, H, W]``, optionally with ``frame_times [B, T]``)."""
        return self.target_encoder(images, **self.token_times(frame_times))

    def jepa_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of one masked batch (see the class docstring for the shapes)."""
        return self.jepa_step(batch)[0]

    def predict_targets(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One masked batch through both branches: ``predictions`` and ``targets``
        ``[R * B, M, Kt, D]`` (targets layer-normed, without gradient), the context encoder's
        output ``context [R * B, Kc, D]``, and the target encoder's ``target_features [B, N, D]``
        (its last block, before the layer norm). ``R`` is the number of mask sets per image."""
        images = batch["images"]  # or clips [B, C, T, H, W]
        context_indices, target_indices = batch["context_indices"], batch["target_indices"]
        context_mask = batch.get("context_mask")  # [R * B, Kc], True for real tokens, when padded
        rows, num_blocks, num_targets = target_indices.shape
        # Clips may carry frame_times [B, T] (seconds), which M-RoPE turns into temporal positions.
        times = self.token_times(batch.get("frame_times"))
        # A FlexiViT batch (data.train_patch_sizes) says its patch size; its masks are on that grid.
        flexi, predictor_grid = self.step_patch_size(batch.get("patch_size")), {}
        if flexi:
            side = self.hparams.image_size // flexi["patch_size"]
            predictor_grid = {"grid": (side, side)}
        # R mask sets per image (data.masks_per_image): row r * B + i masks image i, and the
        # target encoder's pass over the B images serves all R of them.
        repeats = rows // images.size(0)
        if repeats < 1 or rows % images.size(0) or context_indices.size(0) != rows:
            raise ValueError(
                f"the batch's masks ({context_indices.size(0)} context and {rows} target rows) must be a "
                f"whole multiple of its {images.size(0)} images (data.masks_per_image)."
            )
        with index_checks(self.hparams.debug_checks):
            with torch.no_grad():
                norm = self.hparams.target_norm
                if self.hparams.target_last_blocks == 1:  # the encoder's own forward (compiled with model.compile)
                    target_features = self.target_encoder(images, **times, **flexi)
                    normed = normalize_targets(target_features, norm)
                else:
                    blocks = self.target_encoder.block_outputs(
                        images, self.hparams.target_last_blocks, **times, **flexi
                    )
                    target_features = blocks[-1]
                    normed = torch.stack([normalize_targets(b, norm) for b in blocks]).mean(0)
                if repeats > 1:
                    normed = normed.repeat(repeats, 1, 1)
                targets = gather_patches(normed, target_indices.flatten(1))
                targets = targets.view(rows, num_blocks, num_targets, -1)
            if repeats > 1:
                images = images.repeat(repeats, *(1,) * (images.dim() - 1))
                times = {name: value.repeat(repeats, *(1,) * (value.dim() - 1)) for name, value in times.items()}
            context = self.encoder(images, context_indices, token_mask=context_mask, **times, **flexi)
            predictions = self.predictor(
                context,
                context_indices,
                target_indices,
                context_mask=context_mask,
                target_mask=batch.get("target_mask"),
                **times,
                **predictor_grid,
            )
        out = {"predictions": predictions, "targets": targets, "context": context, "target_features": target_features}
        if "target_mask" in batch:  # static shapes: padded target slots, left out of the loss
            out["target_mask"] = batch["target_mask"]
        return out

    def prediction_loss(
        self, predictions: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
    ) -> torch.Tensor:
        """The JEPA loss (``model.loss``: smooth L1 or MSE) between predictions and targets, in float32."""
        loss_fn = F.mse_loss if self.hparams.loss == "mse" else F.smooth_l1_loss
        return loss_fn(predictions.float(), targets.float(), reduction=reduction)

    @torch.no_grad()
    def native_features(
        self, images: list[torch.Tensor], encoder: str = "target", token_budget: int | None = None
    ) -> torch.Tensor:
        """Mean-pooled features ``[B, D]`` of images at their own sizes (each ``[C, H, W]``, sides
        multiples of the patch size, at most ``image_size``), packed several to a sequence of
        ``token_budget`` slots (default: one full-size image's tokens) and pooled per image."""
        patch, side = self.hparams.patch_size, self.hparams.image_size // self.hparams.patch_size
        patches = [patchify(image, patch) for image in images]
        positions = [canvas_positions((im.size(-2) // patch, im.size(-1) // patch), (side, side)) for im in images]
        bins = pack_greedy([x.size(0) for x in patches], token_budget or side * side)
        packed = pack(patches, positions, bins)
        network = self.target_encoder if encoder == "target" else self.encoder
        return pooled_per_image(network.forward_packed(packed), packed.image_ids, len(images))

    def pooled_target_features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each image's mean target-encoder feature ``[B, D]`` for a masked batch of either kind
        (square images or clips; packed native-resolution images), masks ignored."""
        if "full_values" in batch:
            full = Packed(batch["full_values"], batch["full_positions"], batch["full_ids"])
            return pooled_per_image(self.target_encoder.forward_packed(full), full.image_ids, batch["labels"].size(0))
        return self.target_encoder(batch["images"], **self.token_times(batch.get("frame_times"))).mean(dim=1)

    def predict_packed(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A native-resolution batch (:class:`ijepa.data.native.PackedMaskCollator`) through both
        branches: ``predictions`` and ``targets`` ``[T, D]`` (every target token of every image,
        targets normalised by ``target_norm``, without gradient), the context encoder's packed
        output ``context [S, L, D]`` with ``context_mask`` (real slots) and ``context_pooled
        [B, D]`` (each image's mean context token), and ``target_features [B, D]``, each image's
        mean target feature."""
        if self.hparams.target_last_blocks != 1:
            raise ValueError("native-resolution batches take target_last_blocks=1 (the last block's output).")
        num_images = batch["labels"].size(0)
        full = Packed(batch["full_values"], batch["full_positions"], batch["full_ids"])
        context_in = Packed(batch["context_values"], batch["context_positions"], batch["context_ids"])
        layout = Packed(None, batch["pred_positions"], batch["pred_ids"], batch["pred_groups"])
        target_slot = batch["pred_target_slot"]
        with torch.no_grad():
            features = self.target_encoder.forward_packed(full)  # [S_f, L_f, D]
            if self.hparams.target_norm == "layer":
                normed = F.layer_norm(features, features.shape[-1:])
            else:  # each feature over its own image's tokens, wherever the packing put them
                normed = instance_norm_per_image(features, full.image_ids, num_images)
            targets = normed.flatten(0, 1)[target_slot[target_slot >= 0]]
            target_features = pooled_per_image(features, full.image_ids, num_images)
        context = self.encoder.forward_packed(context_in)
        predictions = self.predictor.forward_packed(context, layout, batch["pred_context_slot"], target_slot)
        return {
            "predictions": predictions,
            "targets": targets,
            "context": context,
            "context_mask": context_in.real,
            "context_pooled": pooled_per_image(context, context_in.image_ids, num_images),
            "target_features": target_features,
        }

    def jepa_step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the target encoder's features of every patch ``[B, N, D]`` (its last block,
        before the loss's layer norm; for native-resolution batches each image's mean ``[B, D]``),
        for monitors that need them. With SIGReg on, the loss is ``(1 - w) * jepa + w * sigreg``
        and both parts are logged (``*/jepa_loss``, ``*/sigreg``); with ``varcov_weight`` ``v``,
        ``+ v * varcov`` is added (logged as ``*/varcov``, and the JEPA part as ``*/jepa_loss``)."""
        out = self.predict_packed(batch) if "full_values" in batch else self.predict_targets(batch)
        context, target_features = out["context"], out["target_features"]
        context_mask = out.get("context_mask", batch.get("context_mask"))
        if "target_mask" in out:
            per_value = self.prediction_loss(out["predictions"], out["targets"], reduction="none")  # [R*B, M, Kt, D]
            weights = out["target_mask"].to(per_value.dtype)[..., None]
            loss = (per_value * weights).sum() / (weights.sum() * per_value.size(-1))
        else:
            loss = self.prediction_loss(out["predictions"], out["targets"])
        stage = None
        if self._trainer is not None:
            stage = "train" if self.training else ("test" if self.trainer.testing else "val")
        kinds = self.regulariser_kinds(self.hparams.sigreg_input) if self.sigreg is not None else ()
        varcov_kinds = self.regulariser_kinds(self.hparams.varcov_input) if self.varcov is not None else ()
        # the sampled context tokens and the pooled context, each drawn once for both regularisers
        inputs = {}
        for kind in dict.fromkeys((*kinds, *varcov_kinds)):  # each kind once, in a fixed order
            if kind == "pooled" and "context_pooled" in out:
                inputs[kind] = out["context_pooled"]
            else:
                inputs[kind] = self.sigreg_inputs(context, context_mask, kind)
        if stage is not None and inputs:
            self.log(f"{stage}/jepa_loss", loss.detach(), sync_dist=stage != "train")
        if self.sigreg is not None:
            weight = self.hparams.sigreg_weight
            sigreg = self.sigreg_statistic([inputs[kind] for kind in kinds])
            if stage is not None:
                self.log(f"{stage}/sigreg", sigreg.detach(), sync_dist=stage != "train")
            loss = (1 - weight) * loss + weight * sigreg
        if self.varcov is not None:
            varcov = sum(self.varcov(inputs[kind]) for kind in varcov_kinds) / len(varcov_kinds)
            if stage is not None:
                self.log(f"{stage}/varcov", varcov.detach(), sync_dist=stage != "train")
            loss = loss + self.hparams.varcov_weight * varcov
        return loss, target_features

    @staticmethod
    def regulariser_kinds(setting: str) -> tuple[str, ...]:
        """The inputs a ``sigreg_input`` / ``varcov_input`` setting names: ``both`` is tokens and pooled."""
        return ("tokens", "pooled") if setting == "both" else (setting,)

    @contextlib.contextmanager
    def regularisers_off(self):
        """Within the block the loss is the JEPA loss alone (SIGReg and the variance-covariance
        terms off), e.g. to compare it with code that has neither."""
        saved = self.sigreg, self.varcov
        self.sigreg, self.varcov = None, None
        try:
            yield self
        finally:
            self.sigreg, self.varcov = saved

    def sigreg_statistic(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """SIGReg of each ``[n, D]`` input, averaged: behind the projector (if any) for
        ``sigreg_projector_share`` of the term, on the inputs themselves for the rest."""
        share = self.hparams.sigreg_projector_share if self.sigreg_projector is not None else 0.0
        total = 0.0
        for x in inputs:
            if share > 0:
                total = total + share * self.sigreg(self.sigreg_projector(x), seed=self.global_step)
            if share < 1:
                total = total + (1 - share) * self.sigreg(x, seed=self.global_step)
        return total / len(inputs)

    def sigreg_inputs(
        self, context: torch.Tensor, context_mask: torch.Tensor | None, kind: str | None = None
    ) -> torch.Tensor:
        """What SIGReg sees of the context encoder's output ``[B, Kc, D]``: for ``kind="tokens"``
        ``[n, D]`` real tokens drawn at random (seeded by the global step and the rank, so resume
        is exact), for ``"pooled"`` each image's mean real token ``[B, D]`` (default: the
        ``sigreg_input`` setting)."""
        kind = kind or self.hparams.sigreg_input
        if kind == "pooled":
            if context_mask is None:
                return context.mean(1)
            weights = context_mask.to(context.dtype)[..., None]
            return (context * weights).sum(1) / weights.sum(1)
        tokens = context.flatten(0, 1) if context_mask is None else context[context_mask]
        count = min(self.hparams.sigreg_tokens, tokens.size(0))
        generator = torch.Generator().manual_seed(self.global_step * 65_537 + self.global_rank)
        chosen = torch.randperm(tokens.size(0), generator=generator)[:count].to(tokens.device)
        return tokens[chosen]

    def saved_checkpoints(self) -> list[tuple[int, str]]:
        """``(global step, path)`` of this run's checkpoints still on disk, newest step first, one
        per step: what its checkpoint callbacks keep (``last.ckpt``, the top-k files), the
        ``previous-last.ckpt`` that :class:`~ijepa.checkpoint.AtomicCheckpointIO` keeps, and the
        ``ckpt_path`` it resumed from. Every one is finite: :meth:`on_save_checkpoint` refuses the
        others, :meth:`on_load_checkpoint` refuses to load them."""
        callbacks = self.trainer.checkpoint_callbacks if self._trainer is not None else []
        resumed = self.trainer.ckpt_path if self._trainer is not None else None
        paths = []
        for callback in callbacks:
            last = getattr(callback, "last_model_path", "")
            paths += [last, str(previous_path(last)) if last else "", getattr(callback, "best_model_path", "")]
            paths += list(getattr(callback, "best_k_models", {}))
        paths.append(str(resumed) if resumed else "")
        steps = {}
        for path in dict.fromkeys(p for p in paths if p and os.path.isfile(p)):
            try:  # mmap: reads the step, not the tensors
                step = torch.load(path, mmap=True, weights_only=True, map_location="cpu")["global_step"]
            except Exception:
                continue
            steps.setdefault(int(step), path)  # last.ckpt first: it is the one a user resumes
        return sorted(steps.items(), reverse=True)

    def _resume_advice(self) -> str:
        saved = self.saved_checkpoints()
        if not saved:
            return "No checkpoint of this run was written: restart with a lower model.lr or longer model.warmup_steps."
        (step, newest), earlier = saved[0], saved[1:]
        # A finite checkpoint can already hold a diverging state (weights grown by an lr that is
        # too high): resumed, even at lr 0, its next step's gradients overflow. So the advice
        # names the checkpoint before the newest one, which AtomicCheckpointIO keeps.
        state = (
            "the state this diverging step started from"
            if step == self.global_step
            else "finite, but it may already hold the diverging state"
        )
        if not earlier:
            return (
                f"The only checkpoint left, {newest} (step {step}), is {state}; resume it with a lower model.lr "
                "or a longer model.warmup_steps, or restart if it diverges again at once."
            )
        return (
            f"Resume from the checkpoint before the newest, {earlier[0][1]} (step {earlier[0][0]}), with a lower "
            f"model.lr or a longer model.warmup_steps (or precision 32-true / bf16-mixed); the newest, {newest} "
            f"(step {step}), is {state}: resumed, it can give NaN at its next step at any learning rate. If the "
            "one before diverges at once too, the divergence began earlier: restart with a lower model.lr."
        )

    def _diverged(self, what: str) -> FloatingPointError:
        return FloatingPointError(
            f"{what} at step {self.global_step} (epoch {self.current_epoch}); stopping without saving. "
            + self._resume_advice()
        )

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.jepa_loss(batch)
        if not torch.isfinite(loss):
            # Stop before the optimizer step and before any checkpoint is written, so the last
            # good checkpoint stays the last one on disk.
            raise self._diverged(f"non-finite train/loss ({loss.item()})")
        optimizer = self.optimizers(use_pl_optimizer=False)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", optimizer.param_groups[0]["lr"])
        self.log("train/weight_decay", optimizer.param_groups[0]["weight_decay"])
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """Logs ``val/loss``; returns the mean-pooled target features ``[B, D]`` for
        :class:`ijepa.callbacks.CollapseMonitor`."""
        loss, target_features = self.jepa_step(batch)
        self.log("val/loss", loss, sync_dist=True)
        pooled = target_features if target_features.dim() == 2 else target_features.mean(dim=1)
        return {"loss": loss, "target_features": pooled}

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("test/loss", self.jepa_loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx: int) -> dict[str, torch.Tensor]:
        """Mean-pooled target features ``[B, D]`` and labels ``[B]`` of an ``(images, labels)`` batch."""
        images, labels = batch["images"], batch["labels"]
        return {"features": self.features(images, frame_times=batch.get("frame_times")), "labels": labels}

    # --- optimisation -----------------------------------------------------------------------
    def total_steps(self) -> int:
        """Optimizer steps in the whole run, the length of every schedule."""
        return max(int(self.trainer.estimated_stepping_batches), 1)

    def weight_decay_at(self, step: int) -> float:
        """Cosine weight decay ``weight_decay -> final_weight_decay`` at optimizer ``step``."""
        hp = self.hparams
        return cosine_schedule(step, self.total_steps(), hp.weight_decay, hp.final_weight_decay)

    def lr_at(self, step: int) -> float:
        """Learning rate at optimizer ``step``: linear warm-up, then cosine decay."""
        hp = self.hparams
        total = self.total_steps()
        return warmup_cosine_schedule(step, total, min(hp.warmup_steps, total), hp.lr, hp.final_lr, hp.start_lr)

    def parameter_groups(self) -> tuple[list[str], list[str]]:
        """Names of the trainable parameters with and without weight decay, in optimizer order.

        No weight decay on biases and norms (every parameter under 2-D), nor on what a submodule
        lists in its ``no_weight_decay()`` (position tables, the mask token), as in I-JEPA and timm.
        """
        exempt = {
            f"{prefix}.{name}" if prefix else name
            for prefix, module in self.named_modules()
            if callable(getattr(module, "no_weight_decay", None))
            for name in module.no_weight_decay()
        }
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim < 2 or name in exempt else decay).append(name)
        return decay, no_decay

    def build_optimizer(self) -> torch.optim.AdamW:
        """AdamW over :meth:`parameter_groups` (fused on CUDA, foreach elsewhere), at ``lr``."""
        params = dict(self.named_parameters())
        decay, no_decay = self.parameter_groups()
        groups = [
            {
                "params": [params[n] for n in decay],
                "weight_decay": self.hparams.weight_decay,
                "scheduled_weight_decay": True,
            },
            {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "scheduled_weight_decay": False},
        ]
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(
            groups, lr=self.hparams.lr, betas=tuple(self.hparams.betas), fused=fused, foreach=None if fused else True
        )

    def configure_optimizers(self):
        optimizer = self.build_optimizer()
        base_lr = self.hparams.lr if self.hparams.lr > 0 else 1.0
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.lr_at(step) / base_lr)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # A finite loss can still give an update that overflows (inf or NaN gradients): check the
        # weights themselves, before the EMA copies them and before a checkpoint can be written.
        # One fused norm a step; its sync costs what the loss check above already costs.
        params = [p for p in self.parameters() if p.requires_grad]
        total = torch.nn.utils.get_total_norm(params)
        if not torch.isfinite(total):
            bad = sum(not torch.isfinite(p).all() for p in params)
            raise self._diverged(
                f"non-finite weights after the optimizer step ({bad} of {len(params)} trainable tensors "
                f"hold inf or NaN; total norm {total.item()})"
            )

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        weight_decay = self.weight_decay_at(self.global_step)
        for group in self.optimizers(use_pl_optimizer=False).param_groups:
            if group["scheduled_weight_decay"]:
                group["weight_decay"] = weight_decay

    # --- checkpoints at another resolution ---------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Never write non-finite weights: ModelCheckpoint deletes the previous file after a save,
        # so a NaN state written once would replace the last finite one.
        bad = non_finite_tensors(checkpoint["state_dict"])
        if bad:
            raise FloatingPointError(
                f"refusing to write a checkpoint with non-finite weights at step {self.global_step} ({len(bad)} tensors: "
                f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}). {self._resume_advice()}"
            )
        checkpoint["resolution"] = {"image_size": self.hparams.image_size, "patch_size": self.hparams.patch_size}
        if self.hparams.num_frames:
            checkpoint["resolution"].update(num_frames=self.hparams.num_frames, tubelet_size=self.hparams.tubelet_size)
        # The only global randomness of a step is stochastic depth; data order, augmentations
        # and masks are seeded per sample (ijepa.data.sampling). Tensors only: weights_only loads.
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Adapt a checkpoint saved at another image or patch size to this model, before loading.

        Learned position tables (encoders and predictor) are interpolated, patch kernels resized
        (FlexiViT), sin-cos and RoPE rebuilt; optimizer moments of resized parameters follow the
        same map so ``fit`` can continue at the new resolution. Anything else that does not fit
        raises ValueError listing the keys. Runs for ``Trainer(ckpt_path=...)`` and
        ``IJEPA.load_from_checkpoint``.
        """
        # A NaN checkpoint would be scored (validate, test, predict) or trained (fit) without a word.
        bad = non_finite_tensors(checkpoint.get("state_dict", {}))
        if bad:
            source = f"ckpt_path={str(self.trainer.ckpt_path)!r}" if self._trainer is not None else "the checkpoint"
            raise ValueError(
                f"{source} holds non-finite weights ({len(bad)} tensor{'s' * (len(bad) > 1)} with NaN or inf: "
                f"{', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); refusing to load it. Use an earlier "
                "checkpoint of the run (previous-last.ckpt beside last.ckpt is the one before the newest)."
            )
        # The grid it was trained on: recorded by on_save_checkpoint, since load_from_checkpoint
        # overwrites the saved hyperparameters with its keyword arguments (e.g. image_size=96).
        rng = checkpoint.get("rng_states")
        if rng is not None and self._trainer is not None and self.trainer.state.fn == "fit":
            torch.set_rng_state(rng["torch"])
            if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])
        saved = checkpoint.get("resolution") or checkpoint.get("hyper_parameters") or {}
        old_image = saved.get("image_size", self.hparams.image_size)
        old_patch = saved.get("patch_size", self.hparams.patch_size)
        if old_image % old_patch != 0:
            raise ValueError(f"checkpoint has image_size={old_image} not divisible by patch_size={old_patch}.")
        old_grid = (old_image // old_patch,) * 2
        if self.hparams.num_frames:
            old_frames = saved.get("num_frames", self.hparams.num_frames)
            old_tubelet = saved.get("tubelet_size", self.hparams.tubelet_size)
            if (old_patch, old_tubelet) != (self.hparams.patch_size, self.hparams.tubelet_size):
                raise ValueError(
                    f"a clip checkpoint can change image_size and num_frames, not the tubelet: it has patch_size={old_patch}, "
                    f"tubelet_size={old_tubelet}; this model has {self.hparams.patch_size}, {self.hparams.tubelet_size}."
                )
            old_grid = (old_frames // old_tubelet, *old_grid)
        settings = self.position_interpolation
        if settings["mode"] not in INTERPOLATION_MODES:
            raise ValueError(
                f"position interpolation mode must be one of {INTERPOLATION_MODES}, got {settings['mode']!r}."
            )
        new_grid = self.encoder.grid if self.hparams.num_frames else (self.encoder.patch_embed.grid_size,) * 2
        if "state_dict" not in checkpoint:
            # A sharded strategy (ijepa.strategy.FSDP2Strategy) has loaded the weights itself, before this hook.
            if (old_image, old_patch, tuple(old_grid)) != (
                self.hparams.image_size,
                self.hparams.patch_size,
                tuple(new_grid),
            ):
                raise ValueError(
                    f"the checkpoint was trained at image_size={old_image}, patch_size={old_patch} (grid {list(old_grid)}); "
                    f"this sharded run is at image_size={self.hparams.image_size}, patch_size={self.hparams.patch_size}. "
                    "A sharded strategy loads weights before they can be adapted: adapt the checkpoint in one process "
                    "first (IJEPA.load_from_checkpoint(path, image_size=..., patch_size=...), then save it)."
                )
            return
        changed = resize_state_dict(
            self, checkpoint["state_dict"], old_grid, old_patch, settings["mode"], settings["antialias"]
        )
        if not changed:
            return
        resize_optimizer_states(checkpoint, changed, [name for group in self.parameter_groups() for name in group])
        lines = [f"  {key}: {list(old)} -> {list(new)}" for key, (old, new, _) in changed.items()]
        frames = f", num_frames={saved.get('num_frames')}" if self.hparams.num_frames else ""
        new_frames = f", num_frames={self.hparams.num_frames}" if self.hparams.num_frames else ""
        rank_zero_info(
            f"Checkpoint adapted from image_size={old_image}, patch_size={old_patch}{frames} (grid {'x'.join(map(str, old_grid))}) "
            f"to image_size={self.hparams.image_size}, patch_size={self.hparams.patch_size}{new_frames} "
            f"(grid {'x'.join(map(str, new_grid))}) with {settings['mode']} interpolation:\n" + "\n".join(lines)
        )

    def on_train_start(self) -> None:
        if self.trainer.ckpt_path:
            # LambdaLR restored its base lr from the checkpoint; a resumed run may have a new
            # model.lr, so rebase it and set this step's lr by the scheduler's own formula.
            for config in self.trainer.lr_scheduler_configs:
                scheduler = config.scheduler
                scheduler.base_lrs = [self.hparams.lr if self.hparams.lr > 0 else 1.0] * len(scheduler.base_lrs)
                for group, base, factor in zip(
                    scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
                ):
                    group["lr"] = base * factor(scheduler.last_epoch)
        # Any callback that declares it moves the target (EMATargetUpdate does) will do.
        if not any(getattr(cb, "updates_target_encoder", False) for cb in self.trainer.callbacks):
            rank_zero_warn(
                "No EMATargetUpdate callback: the target encoder will stay at its initial weights. "
                "Add `- class_path: ijepa.callbacks.EMATargetUpdate` to trainer.callbacks."
            )
