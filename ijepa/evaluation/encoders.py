"""The frozen encoder an evaluation reads: from an ``ijepa fit`` checkpoint (or a weights-only
``ijepa convert ... ckpt``), a Hugging Face ``IJepaModel`` folder, or raw pixels as a baseline.

Every kind answers the same questions, so the protocols never ask which kind they hold:
:meth:`FrozenEncoder.block_means` (mean-pooled, normed outputs of the last blocks, what linear
heads, logistic regression and k-NN read), :meth:`FrozenEncoder.tokens` (every token of the
last block, what the attentive probe reads) and :meth:`FrozenEncoder.block_tokens` (every token
of the last blocks, what the segmentation heads read). Clip encoders answer them for clips, with their
frame times; an ijepa checkpoint can be evaluated at another image size, patch size or frame
count, adapted as ``ijepa validate`` adapts it (:func:`adapt_ijepa`, :func:`rebuild_at`).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
import yaml
from torch import nn

from ijepa.checkpoint import load_adapted, non_finite_tensors
from ijepa.interop.encoder import CLIP_OPTIONS, ENCODER_OPTIONS, file_digest, load_encoder
from ijepa.interop.huggingface import load_hf
from ijepa.legacy import upgrade_config, upgrade_hparams
from ijepa.module import IJEPA
from ijepa.nn.checks import check_range, check_token_grid
from ijepa.nn.video import temporal_positions
from ijepa.nn.vit import VisionTransformer

PIXELS = "pixels"  # the checkpoint value that evaluates raw pixels
RANDOM = "random"  # the checkpoint value that evaluates a randomly initialised encoder of an architecture


class FrozenEncoder(nn.Module):
    """An encoder in eval mode without gradients. ``depth`` blocks of width ``width``; images
    ``[B, 3, image_size, image_size]`` cut in ``patch_size`` patches, or, for a clip encoder
    (``num_frames > 0``), clips ``[B, 3, num_frames, image_size, image_size]`` cut in ``tubelet_size``
    x ``patch_size`` x ``patch_size`` tubelets, optionally with ``frame_times [B, T]`` (seconds).
    ``adapted`` says how the weights were adapted to another size than the checkpoint's (None: they
    were not)."""

    depth: int
    width: int
    image_size: int
    patch_size: int
    num_frames: int = 0  # 0: an image encoder
    tubelet_size: int = 1
    adapted: dict | None = None

    @torch.no_grad()
    def block_means(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, last_blocks, D]`` (clips ``[B, 3, T, H, W]``): each of the last
        blocks' normed outputs, averaged over the tokens (oldest block first)."""
        raise NotImplementedError

    @torch.no_grad()
    def tokens(self, images: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, K, D]`` (clips ``[B, 3, T, H, W] -> [B, T' H' W', D]``): the last
        block's normed output at every token."""
        raise NotImplementedError

    @torch.no_grad()
    def block_tokens(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, 3, H, W] -> [B, last_blocks, K, D]``: each of the last blocks' normed output at
        every token (oldest block first; tokens row-major on the :attr:`token_grid`)."""
        raise NotImplementedError

    @property
    def token_grid(self) -> tuple[int, int]:
        """``(rows, columns)`` of an image's patch tokens."""
        side = self.image_size // self.patch_size
        return side, side

    @property
    def token_shape(self) -> tuple[int, ...]:
        """The grid every token lies on: :attr:`token_grid` for images, ``(T', rows, columns)`` for clips."""
        if self.num_frames:
            return (self.num_frames // self.tubelet_size, *self.token_grid)
        return self.token_grid


class ViTEncoder(FrozenEncoder):
    """A trained :class:`~ijepa.nn.vit.VisionTransformer`, of images or clips. A clip encoder
    takes ``frame_times [B, T]`` in seconds and hands its network what training did
    (:meth:`ijepa.module.IJEPA.token_times`): each tubelet's first time, in units of ``time_unit``
    (the checkpoint's ``model.time_unit``)."""

    def __init__(self, network: VisionTransformer, time_unit: float = 1.0):
        super().__init__()
        self.network = network.eval().requires_grad_(False)
        embed = network.patch_embed
        self.depth = len(network.transformer.blocks)
        self.width = network.embed_dim
        self.image_size, self.patch_size = embed.image_size, embed.patch_size
        if network.is_clip_encoder:
            self.num_frames, self.tubelet_size = embed.num_frames, embed.tubelet_size
        self.time_unit = time_unit

    def times(self, frame_times: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """``{"frame_times": [B, T']}`` in temporal positions for a clip batch's ``[B, T]`` seconds, or ``{}``."""
        if frame_times is None:
            return {}
        if not self.num_frames:
            raise ValueError("frame_times were given for an image encoder (a clip encoder has num_frames > 0).")
        return {"frame_times": temporal_positions(frame_times, self.tubelet_size, self.time_unit)}

    @torch.no_grad()
    def block_means(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not 1 <= last_blocks <= self.depth:
            raise ValueError(f"last_blocks must be in 1..{self.depth} (the encoder's depth), got {last_blocks}.")
        outputs = self.network.block_outputs(images, last_blocks, **self.times(frame_times))
        return torch.stack([output.mean(dim=1) for output in outputs], dim=1)

    @torch.no_grad()
    def tokens(self, images: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        return self.network(images, **self.times(frame_times))

    @torch.no_grad()
    def block_tokens(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not 1 <= last_blocks <= self.depth:
            raise ValueError(f"last_blocks must be in 1..{self.depth} (the encoder's depth), got {last_blocks}.")
        return torch.stack(self.network.block_outputs(images, last_blocks, **self.times(frame_times)), dim=1)


class PixelEncoder(FrozenEncoder):
    """Raw pixels as features, the floor every encoder should clear, read as an encoder is: the
    tokens are the (normalised) image's patches, ``[B, (H/p)^2, 3 p p]``, and the pooled feature
    their mean, ``[B, 1, 3 p p]`` (the whole image flattened is ``GridReadout(grid: null)``,
    :mod:`ijepa.evaluation.readouts`). One block. With ``num_frames > 0`` the same for clips:
    tubelet-sized tokens, ``[B, (T/t) (H/p)^2, 3 t p p]`` (frame times carry nothing pixels could
    use: they are ignored)."""

    def __init__(self, image_size: int, patch_size: int, num_frames: int = 0, tubelet_size: int = 2):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size {patch_size} must divide image_size {image_size} for the pixel baseline.")
        if num_frames and num_frames % tubelet_size:
            raise ValueError(
                f"pixel_tubelet_size {tubelet_size} must divide data.num_frames {num_frames} for the pixel baseline."
            )
        self.patch_size, self.image_size, self.depth = patch_size, image_size, 1
        self.num_frames, self.tubelet_size = num_frames, tubelet_size if num_frames else 1
        self.width = 3 * self.tubelet_size * patch_size * patch_size

    @torch.no_grad()
    def block_means(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        if last_blocks != 1:
            raise ValueError(f"last_blocks must be 1 for raw pixels (one 'block'), got {last_blocks}.")
        return self.tokens(images).mean(dim=1, keepdim=True)

    @torch.no_grad()
    def tokens(self, images: torch.Tensor, frame_times: torch.Tensor | None = None) -> torch.Tensor:
        p, t = self.patch_size, self.tubelet_size
        if images.dim() == 5:  # clips [B, C, T, H, W]: tubelets in the (t, row, column) order of TubeletEmbed
            tubes = images.unfold(2, t, t).unfold(3, p, p).unfold(4, p, p)  # [B, C, T/t, H/p, W/p, t, p, p]
            return tubes.permute(0, 2, 3, 4, 1, 5, 6, 7).flatten(4).flatten(1, 3)
        patches = images.unfold(2, p, p).unfold(3, p, p)  # [B, C, H/p, W/p, p, p]
        return patches.permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)

    @torch.no_grad()
    def block_tokens(
        self, images: torch.Tensor, last_blocks: int, frame_times: torch.Tensor | None = None
    ) -> torch.Tensor:
        if last_blocks != 1:
            raise ValueError(f"last_blocks must be 1 for raw pixels (one 'block'), got {last_blocks}.")
        return self.tokens(images, frame_times).unsqueeze(1)


def open_encoder(
    checkpoint: str,
    encoder: str = "target",
    image_size: int | None = None,
    patch_size: int | None = None,
    num_frames: int | None = None,
    tubelet_size: int = 2,
    architecture: dict | str | None = None,
    seed: int = 0,
    architecture_flag: str = "--architecture",
) -> tuple[FrozenEncoder, dict]:
    """``(frozen encoder, description)`` of ``checkpoint``: an ``ijepa fit`` checkpoint, a
    weights-only conversion, a Hugging Face ``IJepaModel`` folder, ``pixels``, or ``random``: an
    encoder of ``architecture`` (:func:`architecture_options`) freshly initialised from ``seed``,
    the from-scratch baseline. The description
    (path, SHA-256, format, encoder) goes into the results file and keys the feature cache.

    ``image_size``, ``patch_size`` and ``num_frames`` (None: the checkpoint's) other than the
    checkpoint's adapt an ijepa checkpoint's encoder as ``ijepa validate --data.image_size ...``
    does (:func:`adapt_ijepa`); a Hugging Face folder is evaluated at its own size. For ``pixels``
    they size the baseline (``patch_size`` x ``patch_size`` tokens, ``tubelet_size`` frames deep
    for clips, whose ``num_frames`` says the pixels are clips)."""
    if encoder not in ("target", "online"):
        raise ValueError(f"encoder must be 'target' or 'online', got {encoder!r}.")
    if checkpoint == PIXELS:
        if image_size is None:
            raise ValueError("checkpoint=pixels needs data.image_size (the pixel baseline has no size of its own).")
        frozen = PixelEncoder(image_size, 16 if patch_size is None else patch_size, num_frames or 0, tubelet_size)
        return frozen, {"path": PIXELS, "sha256": None, "format": PIXELS, "encoder": None}
    if checkpoint == RANDOM:
        if architecture is None:
            raise ValueError(
                f"checkpoint=random needs an architecture ({architecture_flag}): an ijepa fit config, e.g. "
                "configs/quickstart.yaml, or the encoder's options, e.g. {embed_dim: 128, depth: 4, num_heads: 4}."
            )
        options = architecture_options(architecture)
        if image_size is not None:
            options["image_size"] = image_size
        if patch_size is not None:
            options["patch_size"] = patch_size
        network = random_encoder(options, seed)
        return ViTEncoder(network), {
            "path": RANDOM,
            "sha256": None,
            "format": RANDOM,
            "encoder": None,
            "architecture": options,
            "seed": seed,
        }
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint={checkpoint!r} does not exist.")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"checkpoint={checkpoint!r} is a folder without config.json: neither an ijepa checkpoint nor an "
                "exported Hugging Face IJepaModel folder (ijepa convert ... hf)."
            )
        if encoder != "target":
            raise ValueError("encoder=online: a Hugging Face folder holds one encoder (the one it was exported from).")
        try:
            frozen, kind = ViTEncoder(load_hf(path)), "hf"
        except ValueError as error:
            try:
                config = json.loads((path / "config.json").read_text())
            except ValueError:
                config = None
            what = (
                "a timm export (ijepa convert ... timm: load it with timm.create_model)"
                if isinstance(config, dict) and {"architecture", "model_args"} <= set(config)
                else f"not a Hugging Face IJepaModel folder ({error})"
            )
            raise ValueError(
                f"checkpoint={checkpoint!r} is {what}. ijepa eval reads an ijepa checkpoint (.ckpt: of ijepa fit or "
                "distill, or an official one converted by ijepa convert ... ckpt) or a Hugging Face IJepaModel "
                "folder (ijepa convert ... hf): evaluate the checkpoint the export was made from."
            ) from None
        wanted = {"image_size": image_size, "patch_size": patch_size, "num_frames": num_frames}
        for option, value in wanted.items():
            if value is not None and value != getattr(frozen, option):
                raise ValueError(
                    f"data.{option}={value}: a Hugging Face folder is evaluated at its own size ({option} "
                    f"{getattr(frozen, option)}); to adapt it, convert it first (ijepa convert {checkpoint} DEST.ckpt "
                    "ckpt) and evaluate that checkpoint."
                )
    else:
        try:
            network, kind = load_encoder(path, encoder), "ijepa"
        except ValueError as error:
            raise ValueError(
                f"checkpoint={checkpoint!r} is not an ijepa checkpoint or an exported encoder ({error}). Official "
                "I-JEPA checkpoints: convert them first (ijepa convert SOURCE DEST ckpt, docs/interop.md)."
            ) from error
        frozen = adapt_ijepa(path, network, encoder, image_size, patch_size, num_frames)
    bad = non_finite_tensors(frozen.network.state_dict())
    if bad:  # it would be scored, and its NaN features cached, without a word
        raise ValueError(
            f"checkpoint={checkpoint!r}: its {encoder} encoder holds non-finite weights ({len(bad)} tensor"
            f"{'s' * (len(bad) > 1)} with NaN or inf: {', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); "
            "refusing to evaluate it. Use an earlier checkpoint of the run (previous-last.ckpt beside last.ckpt is "
            "the one before the newest)."
        )
    return frozen, {
        "path": str(path.resolve()),
        "sha256": file_digest(path),
        "format": kind,
        "encoder": encoder,
    }


def encoder_sizes(network: VisionTransformer) -> dict:
    """What an encoder was built for: image and patch size and token grid (clips: frames and tubelet too)."""
    embed = network.patch_embed
    found = {"image_size": embed.image_size, "patch_size": embed.patch_size}
    if network.is_clip_encoder:
        found.update(num_frames=embed.num_frames, tubelet_size=embed.tubelet_size)
    return {**found, "grid": list(network.grid)}


def check_sizes(trained: dict, image_size: int | None, patch_size: int | None, num_frames: int | None) -> dict:
    """The sizes to evaluate at (each None: the checkpoint's), checked against what an encoder
    trained at ``trained`` (:func:`encoder_sizes`) can be adapted to; errors name the option."""
    for option, value in (("data.image_size", image_size), ("data.patch_size", patch_size)):
        if value is not None:
            check_range(value, option, 1)
    size = trained["image_size"] if image_size is None else image_size
    patch = trained["patch_size"] if patch_size is None else patch_size
    if size % patch:
        whose_size = " (the checkpoint's)" if image_size is None else ""
        whose_patch = " (the checkpoint's)" if patch_size is None else ""
        raise ValueError(
            f"data.image_size={size}{whose_size} is not a multiple of the patch size {patch}{whose_patch}: set "
            "data.image_size to a multiple of it (or data.patch_size to a divisor of it)."
        )
    wanted = {"image_size": size, "patch_size": patch}
    if "num_frames" not in trained:
        if num_frames is not None:
            raise ValueError(f"data.num_frames={num_frames} is for clip checkpoints; this one holds an image encoder.")
        return wanted
    if num_frames is not None:
        check_range(num_frames, "data.num_frames", 1)
    frames, tubelet = trained["num_frames"] if num_frames is None else num_frames, trained["tubelet_size"]
    if patch != trained["patch_size"]:
        raise ValueError(
            f"data.patch_size={patch}: a clip checkpoint's tubelets ({tubelet} x {trained['patch_size']} x "
            f"{trained['patch_size']}) cannot be resized; only data.image_size and data.num_frames can differ from "
            "the checkpoint's."
        )
    if frames % tubelet:
        raise ValueError(f"data.num_frames={frames} is not a multiple of the checkpoint's tubelet size {tubelet}.")
    return {**wanted, "num_frames": frames}


def rebuild_at(checkpoint: dict, **sizes: int) -> tuple[IJEPA, str]:
    """The model of a loaded ijepa ``checkpoint`` rebuilt with other ``sizes`` (``image_size``,
    ``patch_size``, ``num_frames``) and its weights adapted on load, as
    ``IJEPA.load_from_checkpoint(path, **sizes)`` and ``ijepa validate`` adapt them; with the
    report of :func:`ijepa.checkpoint.load_adapted` (one line per changed tensor after the first)."""
    hparams = upgrade_hparams(checkpoint["hyper_parameters"])
    hparams = {key: value for key, value in hparams.items() if not key.startswith("_")}
    model = IJEPA(**{**hparams, **sizes})
    return model, load_adapted(model, checkpoint, **model.position_interpolation)


def adapt_ijepa(
    path: Path,
    network: VisionTransformer,
    encoder: str,
    image_size: int | None = None,
    patch_size: int | None = None,
    num_frames: int | None = None,
) -> ViTEncoder:
    """The frozen ``encoder`` (``target`` or ``online``) of the ijepa checkpoint at ``path``, whose
    ``network`` is already loaded at the checkpoint's own size, at ``image_size`` / ``patch_size``
    / ``num_frames`` (None: the checkpoint's). Another size rebuilds the whole model there and
    loads the checkpoint through :func:`ijepa.checkpoint.load_adapted`, the adaptation of
    ``IJEPA.load_from_checkpoint(path, image_size=..., patch_size=...)`` and so of ``ijepa
    validate``: learned tables interpolated, sin-cos and RoPE rebuilt, the patch kernel resized
    (FlexiViT). The encoder's ``adapted`` then records the trained and evaluated sizes and the
    tensors that changed."""
    # mmap: the hyperparameters without reading the tensors (load_adapted reads those it needs)
    saved = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    time_unit = float(upgrade_hparams(saved["hyper_parameters"]).get("time_unit", 1.0))
    trained = encoder_sizes(network)
    wanted = check_sizes(trained, image_size, patch_size, num_frames)
    if all(trained[key] == value for key, value in wanted.items()):
        return ViTEncoder(network, time_unit)
    hparams = upgrade_hparams(saved["hyper_parameters"])
    # the model's own check would advise model.max_tokens, an option eval does not have
    check_token_grid(
        wanted["image_size"],
        wanted["patch_size"],
        wanted.get("num_frames", 0),
        trained.get("tubelet_size", 1),
        hparams.get("embed_dim", network.embed_dim),
        hparams.get("num_heads", 1),
        hparams.get("max_tokens", 65_536),
        advice=f"Evaluate at a smaller data.image_size (the checkpoint's is {trained['image_size']}) or a larger "
        "data.patch_size.",
    )
    model, report = rebuild_at(saved, **wanted)
    adapted = model.target_encoder if encoder == "target" else model.encoder
    adapted.transformer.checkpoint_every = 0  # no backward pass here: nothing to recompute
    frozen = ViTEncoder(adapted, time_unit)
    frozen.adapted = {
        "trained": trained,
        "evaluated": encoder_sizes(adapted),
        "interpolation": dict(model.position_interpolation),
        # "  key: [old shape] -> [new shape]" per changed tensor; none when every position is rebuilt
        "changed": [line.strip() for line in report.splitlines()[1:]],
    }
    return frozen


def architecture_options(architecture: dict | str) -> dict:
    """The encoder options (:data:`ijepa.interop.encoder.ENCODER_OPTIONS`) an architecture names:
    a dict of them, or the path of an ``ijepa fit`` config whose ``model:`` section (and
    ``data.image_size``) holds them; unset options take :class:`~ijepa.module.IJEPA`'s defaults."""
    if isinstance(architecture, (str, Path)):
        path = Path(architecture)
        if not path.is_file():
            raise FileNotFoundError(
                f"architecture={str(architecture)!r} is neither a config file nor a dict of options."
            )
        loaded = upgrade_config(yaml.safe_load(path.read_text()) or {})[0]
        model, data = loaded.get("model") or {}, loaded.get("data") or {}
        options = {key: model[key] for key in ENCODER_OPTIONS + CLIP_OPTIONS if key in model}
        if "image_size" in data:
            options["image_size"] = data["image_size"]
        if data.get("num_frames"):
            options["num_frames"] = data["num_frames"]
        return options
    if not isinstance(architecture, dict):
        raise ValueError(f"architecture must be a config path or a dict of encoder options, got {architecture!r}.")
    unknown = sorted(set(architecture) - set(ENCODER_OPTIONS + CLIP_OPTIONS))
    if unknown:
        raise ValueError(
            f"architecture: unknown options {unknown}; valid: {', '.join(ENCODER_OPTIONS + CLIP_OPTIONS)}."
        )
    return dict(architecture)


def random_encoder(options: dict, seed: int = 0) -> VisionTransformer:
    """The target encoder ``ijepa fit`` would start from with these model options, drawn from
    ``seed`` (the global RNG is left as it was)."""
    defaults = inspect.signature(IJEPA.__init__).parameters
    full = {key: options.get(key, defaults[key].default) for key in ENCODER_OPTIONS if key in defaults}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if options.get("num_frames"):
            clip = {key: options.get(key, defaults[key].default) for key in CLIP_OPTIONS}
            network = VisionTransformer.for_clips(**clip, **full)
        else:
            network = VisionTransformer.for_images(**full)
    return network.eval().requires_grad_(False)
