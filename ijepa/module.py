"""The IJEPA LightningModule: online encoder, EMA target encoder, predictor, and one step's math."""

from __future__ import annotations

import contextlib
import copy
import functools
import os

import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ijepa.checkpoint import (
    adapt_checkpoint,
    non_finite_update,
    refuse_student_without_teacher,
    refuse_teacher_switch,
    refuse_to_load_non_finite,
    refuse_to_save_non_finite,
    resolution_record,
    restore_rng_states,
    resume_advice,
    rng_states,
    saved_checkpoints,
)
from ijepa.data.batch import GridBatch, LabeledBatch, PackedBatch
from ijepa.legacy import upgrade_hparams
from ijepa.nn.checks import check_heads, check_range, check_token_grid, index_checks
from ijepa.nn.packing import pooled_per_image
from ijepa.nn.predictor import Predictor
from ijepa.nn.sharding import data_parallel_mesh, is_sharded, shard_network
from ijepa.nn.video import temporal_positions
from ijepa.nn.vit import VisionTransformer
from ijepa.objectives import (
    Objective,
    check_resumed_levels,
    context_views,
    latent_predictions,
    latent_weight,
    objective_from_config,
    refuse_packed,
)
from ijepa.optim import OptimConfig, build_adamw, lr_scheduler, rebase_schedulers, set_weight_decay
from ijepa.regularizers import ContextTokens, Regularizer, log_names, regularizer_from_config
from ijepa.step import (
    LOSSES,
    TARGET_NORMS,
    StepOutput,
    forward_context,
    forward_context_packed,
    forward_target,
    forward_target_packed,
    mask_repeats,
    prediction_loss,
    step_patch_size,
    target_blocks,
)
from ijepa.strategy import refuse_fsdp1
from ijepa.teachers import TeacherPolicy, teacher_from_config


class IJEPA(L.LightningModule):
    """I-JEPA: predict the target encoder's features of masked blocks from a context block.

    One step (:mod:`ijepa.step`): the target branch runs the target encoder on every patch, without
    gradient, and gathers the normed targets ``[R * B, M, Kt, D]``; the context branch runs the
    encoder on the context ``[R * B, Kc, D]`` and the predictor to the target positions. The loss
    (smooth L1 or MSE) joins ``model.regularizers`` and ``model.objectives``; the target encoder
    follows the online one by EMA (:class:`ijepa.callbacks.EMATargetUpdate`), never by gradient.
    AdamW, warm-up then cosine learning rate and cosine weight decay follow the official recipe,
    functions of ``global_step`` (:mod:`ijepa.optim`).

    Args:
        image_size: input side in pixels (linked from ``data.image_size`` by the CLI).
        patch_size: patch side in pixels; ``image_size`` must be a multiple of it.
        in_channels: image channels.
        embed_dim: encoder width.
        depth: encoder blocks.
        num_heads: encoder attention heads (must divide ``embed_dim``).
        mlp_ratio: MLP hidden width as a multiple of the block width.
        drop_path_rate: stochastic-depth rate of the last block (linear from 0), encoder and predictor.
        pos_embed: encoder position encoding, a name of ``ijepa.nn.position.POSITION_ENCODINGS``
            (the family table of ``docs/position_embeddings.md``: image and clip members).
        pos_options: the encoder position encoding's own options, e.g. ``{axis_order: row_col}``
            for sincos or ``{base: 10000}`` for rope_axial (the table in
            ``docs/position_embeddings.md`` lists each member's).
        stem: how images become tokens: ``patch`` (one linear projection per patch), ``conv``
            (Xiao et al.'s stride-2 3x3 convolutions on the whole image, :class:`ijepa.nn.stem.ConvStem`)
            or ``conv_in_patch`` (the same on each patch alone: no pixel of a masked patch reaches a
            context token); ``patch_size`` a power of two >= 4; images only; no FlexiViT, packing or
            export: ``docs/training.md``.
        predictor_embed_dim: predictor width.
        predictor_depth: predictor blocks.
        predictor_num_heads: predictor attention heads.
        predictor_pos_embed: predictor position encoding (same names as ``pos_embed``).
        predictor_pos_options: the predictor position encoding's own options.
        predictor_mode: per_block (official: one sequence per target block, context repeated) or
            one_pass (the context's layers run once per image and attend to the context only;
            each block's queries attend to the context and their own block; computed without an
            attention mask; less work per step, different math: ``docs/benchmarks.md``).
        predictor_mlp_ratio: the predictor's MLP width as a multiple of its width (null:
            ``mlp_ratio``; the official predictor's is 4 whatever the encoder's, e.g. ViT-g's 48/11).
        target_dim: width of the targets the predictor predicts (null: ``embed_dim``, the target
            encoder's). Another width is a student's whose targets are a teacher's (``ijepa
            distill``, :mod:`ijepa.distill`, sets it): such a model evaluates, exports and
            resumes, but trains only under ``ijepa distill``.
        loss: smooth_l1 (I-JEPA) or mse, on layer-normed target features.
        target_last_blocks: targets are the average of the last n target-encoder blocks' outputs,
            each normalised by ``target_norm`` (data2vec-style; 1 is I-JEPA's last block only).
        target_norm: how each target block is normalised before the loss: ``layer`` (I-JEPA: each
            token over its features) or ``instance`` (data2vec: each feature over the image's
            tokens, so what every patch of an image shares, e.g. its background, is not a target).
        regularizers: terms on the context encoder's output added to the JEPA loss, each an object
            chosen by ``class_path`` (:mod:`ijepa.regularizers`: ``SIGReg``, ``VarianceCovariance``)
            with its weight, input (tokens, pooled, both), projector and how it combines with the
            loss; applied in list order. Empty (default): the JEPA loss alone.
        objectives: changes to the JEPA objective, each an object chosen by ``class_path``
            (:mod:`ijepa.objectives`: ``ContextLoss``, V-JEPA 2.1's distance-weighted loss on the
            predicted context tokens; ``MultiLevelTargets``, several target-encoder blocks as
            separate targets, which widens the predictor's output; ``Recolour`` and ``ViewInvariance``,
            the context's views; ``PixelTarget``, MAE's norm-pix target). Empty (default): I-JEPA's.
        teacher_policy: how the target encoder moves, an object chosen by ``class_path``
            (:mod:`ijepa.teachers`): ``EMATeacher`` (default; the ``EMATargetUpdate`` callback),
            ``FrozenTeacher`` (its initial weights), ``StepwiseTeacher`` (the online weights copied
            every N steps).
        rescale_residuals: divide each block's residual output projections by ``sqrt(2 * layer)``
            at init (the I-JEPA ViT's constructor); false starts as official I-JEPA training does,
            whose ``init_model`` redraws every Linear after that rescale.
        optim: the optimiser's options (:class:`ijepa.optim.OptimConfig`: ``lr``, ``start_lr``,
            ``final_lr``, ``warmup_steps``, ``weight_decay``, ``final_weight_decay``, ``betas``),
            ``model.optim.*`` in a config; a dict (a checkpoint's) is read as one.
        num_frames: 0 for images; for clips ``[B, C, T, H, W]`` the frames per clip, with a tubelet
            encoder and a video ``pos_embed`` / ``predictor_pos_embed`` (sincos_3d, learned_flat_3d,
            mrope); see ``docs/video.md``. A clip batch may carry ``frame_times [B, T]`` in seconds.
        tubelet_size: frames per tubelet (clips only).
        time_unit: clips with timestamps: seconds per temporal position. The encoders and the
            predictor receive ``frame_time / time_unit`` (per tubelet), which encodings that read
            time (``mrope``) use as the temporal coordinate. Set it near the spacing of
            temporal tokens (``tubelet_size / clip_fps``) so timestamps rotate as much as frame
            indices would; at 1 s a 0.1 s gap barely rotates anything.
        compile: wrap the encoders and predictor in ``torch.compile`` (state-dict keys unchanged).
        compile_options: keyword arguments of that ``torch.compile`` (default ``{dynamic: true}``,
            for masks whose token counts change per batch). With ``data.masks.init_args.context_policy: static``
            every batch has the same shapes: ``{dynamic: false, mode: reduce-overhead}`` captures
            the step once (CUDA graphs on a GPU).
        activation_checkpointing: 0 (off), or n: every n-th block of the online encoder and the
            predictor (1: every block) keeps only its input for the backward pass and recomputes
            its activations there, trading compute for the memory of those activations. The
            target encoder needs none (no backward). Losses and gradients are unchanged.
        debug_checks: run the host-syncing index range checks inside every step (off: the
            indices come from the mask sampler and the collator checks them on the CPU).
        max_tokens: refuse a grid of more tokens per image or clip (null: no bound), with its cost.
    """

    # Arguments that fix the parameters' shapes or meaning: a resumed run cannot change them
    # (the CLI reports a conflict); every other argument may differ from the checkpoint's.
    ARCHITECTURE = tuple(
        "in_channels embed_dim depth num_heads mlp_ratio pos_embed pos_options predictor_embed_dim predictor_depth "
        "predictor_num_heads predictor_pos_embed predictor_pos_options predictor_mode predictor_mlp_ratio target_dim "
        "tubelet_size stem".split()
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
        stem: str = "patch",
        predictor_embed_dim: int = 96,
        predictor_depth: int = 6,
        predictor_num_heads: int = 3,
        predictor_pos_embed: str = "sincos",
        predictor_pos_options: dict | None = None,
        predictor_mode: str = "per_block",
        predictor_mlp_ratio: float | None = None,
        target_dim: int | None = None,
        loss: str = "smooth_l1",
        target_last_blocks: int = 1,
        target_norm: str = "layer",
        regularizers: list[Regularizer] | None = None,
        objectives: list[Objective] | None = None,
        teacher_policy: TeacherPolicy | None = None,
        rescale_residuals: bool = True,
        optim: OptimConfig = OptimConfig(),  # noqa: B008 (frozen: one shared default is safe)
        num_frames: int = 0,
        tubelet_size: int = 2,
        time_unit: float = 1.0,
        compile: bool = False,
        compile_options: dict | None = None,
        activation_checkpointing: int = 0,
        debug_checks: bool = False,
        max_tokens: int | None = 65_536,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
        # Every numeric option is checked before any weight is built, naming itself and its range.
        given = locals()
        positive = ("image_size", "patch_size", "in_channels", "embed_dim", "depth", "num_heads", "tubelet_size")
        for name in (*positive, "predictor_embed_dim", "predictor_depth", "predictor_num_heads"):
            check_range(given[name], name, 1)
        check_range(activation_checkpointing, "activation_checkpointing", 0)
        check_range(embed_dim if target_dim is None else target_dim, "target_dim", 1)
        check_range(mlp_ratio, "mlp_ratio", 0, low_open=True)
        predictor_mlp = mlp_ratio if predictor_mlp_ratio is None else predictor_mlp_ratio
        check_range(predictor_mlp, "predictor_mlp_ratio", 0, low_open=True)
        check_range(drop_path_rate, "drop_path_rate", 0, 1, high_open=True)
        check_range(time_unit, "time_unit", 0, low_open=True)
        if not 1 <= target_last_blocks <= depth:
            raise ValueError(f"target_last_blocks must be in [1, {depth}] (the depth), got {target_last_blocks}.")
        if target_norm not in TARGET_NORMS:
            raise ValueError(f"target_norm must be one of {TARGET_NORMS}, got {target_norm!r}.")
        # Checkpoints keep plain values (they load under weights_only=True): each regulariser's
        # config, which rebuilds it (a dict from a checkpoint is rebuilt here). Objects are
        # copied: two models given one list must not share a projector.
        regularizers = [regularizer_from_config(copy.deepcopy(member)) for member in regularizers or ()]
        objectives = [objective_from_config(copy.deepcopy(member)) for member in objectives or ()]
        self.optim = OptimConfig.of(optim)  # range-checked in its __post_init__
        self.teacher_policy = teacher_from_config(copy.deepcopy(teacher_policy))
        self.save_hyperparameters(ignore=["regularizers", "objectives", "optim", "teacher_policy"])
        self.hparams.update(
            optim=self.optim.record(),
            teacher_policy=self.teacher_policy.config(),
            regularizers=[m.config() for m in regularizers],
            objectives=[m.config() for m in objectives],
        )
        self.objectives, self.target_blocks = nn.ModuleList(objectives), target_blocks(objectives, depth)
        # How checkpoints from another resolution are adapted on load; the
        # PositionEmbeddingInterpolation callback sets these from the config.
        self.position_interpolation = {"mode": "bicubic", "antialias": False}
        if num_frames < 0:
            raise ValueError(f"num_frames must be 0 (images) or a positive frame count, got {num_frames}.")
        check_token_grid(image_size, patch_size, num_frames, tubelet_size, embed_dim, num_heads, max_tokens)
        check_heads(num_heads, embed_dim, "num_heads", "embed_dim")
        check_heads(predictor_num_heads, predictor_embed_dim, "predictor_num_heads", "predictor_embed_dim")
        # one encoder class; the patch or tubelet embedding is what differs
        embedding = (num_frames, image_size, tubelet_size) if num_frames else (image_size,)
        build = VisionTransformer.for_clips if num_frames else VisionTransformer.for_images
        self.encoder = build(
            *embedding, patch_size, in_channels, embed_dim, depth, num_heads, mlp_ratio, drop_path_rate=drop_path_rate,
            pos_embed=pos_embed, rescale_residuals=rescale_residuals, pos_options=pos_options, stem=stem,
        )  # fmt: skip
        grid = self.encoder.grid
        self.target_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
        # a frozen or stepwise teacher is its own network; the target encoder then tracks the online one
        self.teacher_network = None if self.teacher_policy.by_ema else copy.deepcopy(self.target_encoder)
        self.predictor = Predictor(
            grid, embed_dim, predictor_embed_dim, predictor_depth, predictor_num_heads, predictor_mlp,
            drop_path_rate=drop_path_rate, pos_embed=predictor_pos_embed, mode=predictor_mode,
            rescale_residuals=rescale_residuals, pos_options=predictor_pos_options,
            out_levels=len(self.target_blocks), out_dim=target_dim,
        )  # fmt: skip
        for member in self.objectives:  # e.g. a pixel head sized by the predictor
            member.build(self)
        for network in (self.encoder, self.predictor):  # the networks that have a backward pass
            network.transformer.checkpoint_every = activation_checkpointing
        # weight 0 switches a member off: it builds no projector and costs nothing
        self.regularizers = nn.ModuleList(member.build(embed_dim) for member in regularizers if member.weight > 0)
        self.regularizer_log_names = log_names(self.regularizers)  # two SIGRegs log as sigreg, sigreg_1
        self._regularizers_on = True

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's ``load_from_checkpoint``, which also reads older hyperparameter formats
        (:func:`ijepa.legacy.upgrade_hparams`; Lightning would drop the flat regulariser options
        without a word). Explicit ``kwargs`` win, as in Lightning."""
        if isinstance(checkpoint_path, (str, os.PathLike)):
            with contextlib.suppress(Exception):  # remote or unreadable: Lightning reports it below
                saved = torch.load(checkpoint_path, mmap=True, weights_only=True, map_location="cpu")
                hparams = saved.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {}
                changed = {k: v for k, v in upgrade_hparams(hparams).items() if k not in hparams or v != hparams[k]}
                kwargs = {**changed, **kwargs}
        return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict, **kwargs)

    def setup(self, stage: str) -> None:
        # Denormal floats (below 1e-38, e.g. in AdamW's decaying second moments) are very slow on
        # CPU; flushing them to zero only changes values that small.
        torch.set_flush_denormal(True)
        if self._trainer is not None:
            refuse_fsdp1(self.trainer.strategy)

    def configure_model(self) -> None:
        mesh = self.device_mesh  # set by Lightning's ModelParallelStrategy (ijepa.strategy.FSDP2Strategy)
        if mesh is not None and not is_sharded(self.encoder):
            # Online and target encoders sharded alike, so the EMA runs shard by shard.
            data_parallel = data_parallel_mesh(mesh)
            projectors = [member.projector for member in self.regularizers if member.projector is not None]
            heads = [child for member in self.objectives for child in member.children()]  # e.g. a pixel head
            teacher = [] if self.teacher_network is None else [self.teacher_network]
            for network in (self.encoder, self.target_encoder, self.predictor, *projectors, *heads, *teacher):
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
        if self.teacher_network is not None:
            self.teacher_network.eval()
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
        return {"frame_times": temporal_positions(frame_times, self.hparams.tubelet_size, self.hparams.time_unit)}

    def forward(self, images: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """Target-encoder features of every patch, ``[B, C, H, W] -> [B, N, D]`` (clips
        ``[B, C, T, H, W]``, optionally with ``frame_times [B, T]``)."""
        return self.target_encoder(images, **self.token_times(frame_times))

    @property
    def target_network(self) -> nn.Module:
        """What the training targets come from: the EMA target encoder, or the frozen or stepwise
        teacher (:mod:`ijepa.teachers`; a distilled student's: its frozen teacher, :mod:`ijepa.distill`)."""
        return self.target_encoder if self.teacher_network is None else self.teacher_network

    def jepa_loss(self, batch: GridBatch | PackedBatch) -> torch.Tensor:
        """The training loss of one masked batch (see the class docstring for the shapes)."""
        return self.jepa_step(batch)[0]

    def predict(self, batch: GridBatch | PackedBatch) -> StepOutput:
        """One masked batch through both branches (:mod:`ijepa.step`). A grid batch (images or
        clips): :func:`~ijepa.step.forward_target` then :func:`~ijepa.step.forward_context`,
        ``predictions`` and ``targets`` ``[R * B, M, Kt, D']``, the context ``[R * B, Kc, D]``, the
        target encoder's last block ``[B, N, D]``. A native-resolution batch
        (:class:`ijepa.data.native.PackedMaskCollator`): the packed pair, ``predictions`` and
        ``targets`` ``[T, D]``, the packed context ``[S, L, D]`` with ``context_mask`` and
        ``context_pooled [B, D]``, and each image's mean target feature ``[B, D]``."""
        if isinstance(batch, PackedBatch):
            refuse_packed(self.objectives, self.hparams.target_last_blocks)
            count, slot = len(batch), batch.pred_target_slot
            targets, features = forward_target_packed(
                self.target_encoder, batch.full, slot, count, self.hparams.target_norm
            )
            context, predictions = forward_context_packed(
                self.encoder, self.predictor, batch.context, batch.pred, batch.pred_context_slot, slot
            )
            pooled = pooled_per_image(context, batch.context.image_ids, count)
            return StepOutput(predictions, targets, context, features, batch.context.real, pooled)
        hp, masks = self.hparams, (batch.context_indices, batch.target_indices)
        mask_repeats(batch.images.size(0), *masks)
        times = self.token_times(batch.frame_times)  # a clip's timestamps -> temporal positions
        flexi = step_patch_size(batch.patch_size, hp.patch_size, hp.num_frames)  # a FlexiViT batch's own grid
        grid = (hp.image_size // flexi["patch_size"],) * 2 if flexi else tuple(self.encoder.grid)
        with_context = any(member.predicts_context(self.global_step) for member in self.objectives)
        with_hidden = any(member.needs_hidden() for member in self.objectives)
        view = context_views(self.objectives, self.global_step)  # e.g. each context recoloured
        with index_checks(hp.debug_checks):
            features, targets, context_targets = forward_target(
                self.target_network, batch.images, *masks, self.target_blocks, hp.target_last_blocks,
                hp.target_norm, with_context, **times, **flexi,
            )  # fmt: skip
            context, predictions, context_predictions, hidden = forward_context(
                self.encoder, self.predictor, batch.images, *masks, batch.context_mask, batch.target_mask,
                with_context, **times, **flexi, **({"grid": grid} if flexi else {}), context_view=view,
                with_hidden=with_hidden,
            )  # fmt: skip
        return StepOutput(
            predictions, targets, context, features, batch.context_mask, None, batch.target_mask,
            context_predictions, context_targets, *masks, grid, batch.images, hidden,
        )  # fmt: skip

    def pooled_target_features(self, batch: GridBatch | PackedBatch) -> torch.Tensor:
        """Each image's mean target-encoder feature ``[B, D]`` for a masked batch of either kind
        (square images or clips; packed native-resolution images), masks ignored."""
        if isinstance(batch, PackedBatch):
            full = batch.full
            return pooled_per_image(self.target_encoder.forward_packed(full), full.image_ids, len(batch))
        return self.target_encoder(batch.images, **self.token_times(batch.frame_times)).mean(dim=1)

    def jepa_step(self, batch: GridBatch | PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the target encoder's features of every patch ``[B, N, D]`` (its last block,
        before the loss's layer norm; for native-resolution batches each image's mean ``[B, D]``),
        for monitors that need them. Each of ``model.regularizers`` joins the loss in list order
        (``add``: ``+ w * term``; ``mix``: ``(1 - w) * loss + w * term``); the JEPA part is logged as
        ``*/jepa_loss`` and each term under its ``log_name`` (``*/sigreg``, ``*/varcov``)."""
        if not isinstance(batch, (GridBatch, PackedBatch)):
            raise TypeError(
                f"a masked batch is an ijepa.data.batch record (GridBatch, ClipBatch or PackedBatch), got a "
                f"{type(batch).__name__}: build one as GridBatch(images, context_indices, target_indices)."
            )
        out = self.predict(batch)
        loss_fn = functools.partial(prediction_loss, loss=self.hparams.loss)
        jepa = loss_fn(latent_predictions(self.objectives, out.predictions), out.targets, mask=out.target_mask)
        scale = latent_weight(self.objectives)  # e.g. 0: a pixel-only model, the latent loss off the graph
        loss = jepa if scale == 1 else jepa * scale if scale else torch.zeros((), device=jepa.device)
        stage = self._trainer and ("train" if self.training else "test" if self.trainer.testing else "val")

        def log(name: str, value: torch.Tensor | float) -> None:
            if stage:
                value = value.detach() if torch.is_tensor(value) else value
                self.log(f"{stage}/{name}", value, sync_dist=stage != "train", batch_size=len(batch))

        members = list(zip(self.regularizers, self.regularizer_log_names)) if self._regularizers_on else []
        if members or scale != 1:
            log("jepa_loss", jepa)
        context_tokens = ContextTokens(out.context, out.context_mask, out.context_pooled)
        for member, name in members:
            term = member(context_tokens, self.global_step, self.global_rank)
            log(name, term)
            loss = member.combine_with(loss, term)
        for member in self.objectives:  # ijepa.objectives: e.g. V-JEPA 2.1's context loss
            loss, terms = member.add_to(loss, out, self.global_step, loss_fn)
            for name, term in terms.items():
                log(name, term)
        return loss, out.target_features

    @contextlib.contextmanager
    def regularisers_off(self):
        """Within the block the loss is the JEPA loss alone (every regulariser off), e.g. to
        compare it with code that has none."""
        saved, self._regularizers_on = self._regularizers_on, False
        try:
            yield self
        finally:
            self._regularizers_on = saved

    def _resume_advice(self) -> str:
        return resume_advice(saved_checkpoints(self._trainer), self.global_step)

    def _diverged(self, what: str) -> FloatingPointError:
        return FloatingPointError(
            f"{what} at step {self.global_step} (epoch {self.current_epoch}); stopping without saving. "
            + self._resume_advice()
        )

    def training_step(self, batch: GridBatch | PackedBatch, batch_idx: int) -> torch.Tensor:
        loss = self.jepa_loss(batch)
        if not torch.isfinite(loss):
            # Stop before the optimizer step and any checkpoint write: the last good one stays last on disk.
            raise self._diverged(f"non-finite train/loss ({loss.item()})")
        group = self.optimizers(use_pl_optimizer=False).param_groups[0]
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict({"train/lr": group["lr"], "train/weight_decay": group["weight_decay"]})
        # Step guards (ijepa.callbacks.LossSpikeSkip) veto with a loss that reaches no weight: DDP refuses None.
        vetoed = any([guard(self, loss) for guard in getattr(self, "step_guards", ())])
        return loss.detach().requires_grad_() if vetoed else loss

    def validation_step(self, batch: GridBatch | PackedBatch, batch_idx: int) -> dict[str, torch.Tensor]:
        """Logs ``val/loss``; returns the mean-pooled target features ``[B, D]`` for
        :class:`ijepa.callbacks.CollapseMonitor`."""
        loss, target_features = self.jepa_step(batch)
        self.log("val/loss", loss, sync_dist=True, batch_size=len(batch))
        if self.teacher_network is not None:  # the monitors read the encoder that learns, not its teacher
            target_features = self.pooled_target_features(batch)
        pooled = target_features if target_features.dim() == 2 else target_features.mean(dim=1)
        return {"loss": loss, "target_features": pooled}

    def test_step(self, batch: GridBatch | PackedBatch, batch_idx: int) -> None:
        self.log("test/loss", self.jepa_loss(batch), sync_dist=True, batch_size=len(batch))

    def predict_step(self, batch: LabeledBatch, batch_idx: int) -> dict[str, torch.Tensor]:
        """Mean-pooled target features ``[B, D]`` and labels ``[B]`` of a labelled batch."""
        return {"features": self.features(batch.images, frame_times=batch.frame_times), "labels": batch.labels}

    # --- optimisation: ijepa.optim ------------------------------------------------------------
    def total_steps(self) -> int:
        """Optimizer steps in the whole run, the length of every schedule."""
        return max(int(self.trainer.estimated_stepping_batches), 1)

    def build_optimizer(self) -> torch.optim.AdamW:
        return build_adamw(self, self.optim, self.device)

    def configure_optimizers(self):
        if warning := self.optim.warmup_warning(self.total_steps()):
            rank_zero_warn(warning)
        optimizer = self.build_optimizer()
        return {"optimizer": optimizer, "lr_scheduler": lr_scheduler(optimizer, self.optim, self.total_steps)}

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # before the EMA copies the weights and before a checkpoint can be written
        problem = non_finite_update(
            [p for p in self.parameters() if p.requires_grad], "non-finite weights after the optimizer step"
        )
        if problem:
            raise self._diverged(problem)
        # ijepa.teachers, e.g. a stepwise copy: here, before any callback (a checkpoint) sees the step;
        # global_step counts this step only once the optimizer hook returns
        self.teacher_policy.after_step(self, self.global_step + 1)

    @property
    def target_by_ema(self) -> bool:
        """Whether the target encoder follows the online one by EMA (a callback's work,
        ``model.teacher_policy: EMATeacher``); a frozen or stepwise teacher's, or a distilled student's, does not."""
        return self.teacher_policy.by_ema

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        set_weight_decay(
            self.optimizers(use_pl_optimizer=False), self.optim.weight_decay_at(self.global_step, self.total_steps())
        )

    # --- checkpoints: ijepa.checkpoint --------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        refuse_to_save_non_finite(checkpoint, self.global_step, self._resume_advice())
        checkpoint.update(resolution=resolution_record(self.hparams), rng_states=rng_states())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse non-finite weights, restore the RNG for ``fit``, and adapt a checkpoint saved at
        another image or patch size (:func:`ijepa.checkpoint.adapt_checkpoint`). Runs for
        ``Trainer(ckpt_path=...)`` and ``IJEPA.load_from_checkpoint``."""
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        source = f"ckpt_path={str(self.trainer.ckpt_path)!r}" if self._trainer is not None else "the checkpoint"
        refuse_to_load_non_finite(checkpoint, source)
        refuse_student_without_teacher(checkpoint, source, self._trainer, has_teacher=hasattr(self, "distill"))
        refuse_teacher_switch(checkpoint, source, self.hparams.teacher_policy, self.teacher_network is not None)
        check_resumed_levels(checkpoint, self.target_blocks, self.hparams.depth)
        restore_rng_states(checkpoint.get("rng_states") if fitting else None)
        report = adapt_checkpoint(self, checkpoint, **self.position_interpolation)
        if report:
            rank_zero_info(report)

    def on_train_start(self) -> None:
        if self.trainer.ckpt_path:
            rebase_schedulers([config.scheduler for config in self.trainer.lr_scheduler_configs], self.optim)
        if warning := self.teacher_policy.run_warning(self.trainer.estimated_stepping_batches):
            rank_zero_warn(warning)
        # Any callback that declares it moves the target (EMATargetUpdate does) will do.
        if self.target_by_ema and not any(
            getattr(cb, "updates_target_encoder", False) for cb in self.trainer.callbacks
        ):
            rank_zero_warn(
                "No EMATargetUpdate callback: the target encoder will stay at its initial weights. "
                "Add `- class_path: ijepa.callbacks.EMATargetUpdate` to trainer.callbacks."
            )
