"""Every older checkpoint and hyperparameter format, mapped to today's in one place.

Each load path (``IJEPA.load_from_checkpoint`` and ``on_load_checkpoint``, ``ijepa fit
--ckpt_path``, ``ijepa eval`` / ``validate`` at another size, ``ijepa distill``'s teacher, a
position encoding built by name) calls :func:`upgrade_hparams` or :func:`upgrade_state_dict`
and nothing else; a new format is one more entry here and one more test in
``tests/test_legacy.py``. The formats:

* flat regulariser options (``sigreg_weight``, ``varcov_input``, ...) from before
  ``model.regularizers``: the same members as ``class_path`` configs;
* the SIGReg projector's ``sigreg_projector.*`` state-dict keys: ``regularizers.<i>.projector.*``;
* the position encoding ``learned_3d``: ``learned_flat_3d`` (same keys, same weights);
* the flat optimiser options ``lr``, ``start_lr``, ... ``betas`` (before ``model.optim``): the
  same values under ``optim``, in a checkpoint's hyperparameters, and as ``--model.<old>`` flags
  (:func:`upgrade_model_flags`); a config file's ``model:`` section is named by the CLI;
* the data option ``knn_batch_size`` (from when the k-NN probe was the only one):
  ``probe_batch_size``, in a checkpoint's ``datamodule_hyper_parameters`` and in a config.
* flat mask options (``data.target_scale``, ``data.min_keep``, ...) from before ``data.masks``:
  ``masks: {class_path: ijepa.masks.MultiBlockMasks (clips: SpatioTemporalMasks), init_args}``.

Plain data only (no ijepa import): the position registry at the bottom of the package reads it too.
"""

from __future__ import annotations

import warnings

import yaml

# The flat options regularisers had before ``model.regularizers`` (checkpoints until 2026-12).
REGULARIZER_OPTIONS = (
    "sigreg_weight",
    "sigreg_input",
    "sigreg_tokens",
    "sigreg_slices",
    "sigreg_projector",
    "sigreg_projector_share",
    "varcov_weight",
    "varcov_input",
)
PROJECTOR_PREFIX = "sigreg_projector."

# Former position-encoding names -> today's.
RENAMED_POSITIONS = {"learned_3d": "learned_flat_3d"}
POSITION_OPTIONS = ("pos_embed", "predictor_pos_embed")

# The optimiser's options, flat ``model.<name>`` before ``model.optim.<name>`` (checkpoints until 2026-12).
OPTIM_OPTIONS = ("lr", "start_lr", "final_lr", "warmup_steps", "weight_decay", "final_weight_decay", "betas")

# Former ``data.*`` option names -> today's.
RENAMED_DATA_OPTIONS = {"knn_batch_size": "probe_batch_size"}

# The flat ``data.*`` mask options from before ``data.masks`` (checkpoints until 2027-01), and the
# mask kind they meant: images' options, then the clip-only one.
MASK_OPTIONS = (
    "num_target_blocks",
    "target_scale",
    "target_aspect_ratio",
    "context_scale",
    "min_keep",
    "context_policy",
    "masks_per_image",
    "temporal_scale",
)
IMAGE_MASKS, CLIP_MASKS = "ijepa.masks.MultiBlockMasks", "ijepa.masks.SpatioTemporalMasks"


def position_name(name: str) -> str:
    """Today's name of the position encoding ``name`` (itself unless renamed; a former name warns)."""
    if name not in RENAMED_POSITIONS:
        return name
    warnings.warn(
        f"position encoding {name!r} is now called {RENAMED_POSITIONS[name]!r} (the same module: state-dict "
        "keys and weights unchanged); the old name will be removed.",
        FutureWarning,
        stacklevel=3,
    )
    return RENAMED_POSITIONS[name]


def legacy_regularizers(hparams: dict) -> list[dict]:
    """The ``model.regularizers`` configs the flat options of an older checkpoint's
    hyperparameters mean: SIGReg first (it mixed with the JEPA loss), then the
    variance-covariance terms (added), each with the sample size both shared; a member of
    weight 0 was off and is left out."""
    tokens = hparams.get("sigreg_tokens", 1024)
    found = []
    if hparams.get("sigreg_weight", 0.0) > 0:
        sigreg = {
            "weight": hparams["sigreg_weight"],
            "input": hparams.get("sigreg_input", "tokens"),
            "tokens": tokens,
            "projector": hparams.get("sigreg_projector"),
            "projector_share": hparams.get("sigreg_projector_share", 1.0),
            "slices": hparams.get("sigreg_slices", 256),
        }
        found.append({"class_path": "ijepa.regularizers.SIGReg", "init_args": sigreg})
    if hparams.get("varcov_weight", 0.0) > 0:
        varcov = {"weight": hparams["varcov_weight"], "input": hparams.get("varcov_input", "tokens"), "tokens": tokens}
        found.append({"class_path": "ijepa.regularizers.VarianceCovariance", "init_args": varcov})
    return found


def upgrade_hparams(hparams: dict) -> dict:
    """A checkpoint's ``hyper_parameters`` in today's format (a new dict; ``hparams`` itself is
    returned when nothing is old): flat regulariser options become ``regularizers``, flat
    optimiser options ``optim``, former position names today's (with a FutureWarning)."""
    old_options = any(key in hparams for key in REGULARIZER_OPTIONS)
    renamed = [key for key in POSITION_OPTIONS if hparams.get(key) in RENAMED_POSITIONS]
    flat_optim = [key for key in OPTIM_OPTIONS if key in hparams]
    if not (old_options or renamed or flat_optim):
        return hparams
    upgraded = {key: value for key, value in hparams.items() if key not in (*REGULARIZER_OPTIONS, *flat_optim)}
    if old_options:
        upgraded.setdefault("regularizers", legacy_regularizers(hparams))
    if flat_optim:  # the values of a checkpoint: no warning, the file is what it is
        upgraded["optim"] = {**{key: hparams[key] for key in flat_optim}, **(hparams.get("optim") or {})}
    for key in renamed:
        upgraded[key] = position_name(hparams[key])
    return upgraded


def legacy_masks(hparams: dict) -> dict:
    """The ``data.masks`` config the flat mask options of older data hyperparameters mean: the
    spatio-temporal kind for clips (``num_frames > 0``), else the multi-block one, with the options
    that kind has (``context_scale`` never applied to clips, ``temporal_scale`` never to images)."""
    clips = bool(hparams.get("num_frames", 0))
    dropped = "context_scale" if clips else "temporal_scale"
    options = {key: hparams[key] for key in MASK_OPTIONS if key in hparams and key != dropped}
    return {"class_path": CLIP_MASKS if clips else IMAGE_MASKS, "init_args": options}


def upgrade_model_flags(args: list[str]) -> list[str]:
    """Command-line ``args`` with the flat optimiser flags (``--model.lr=1e-3``, ``--model.lr
    1e-3``) as ``--model.optim.<name>``, with a one-line FutureWarning (``args`` itself when none)."""
    old = {f"--model.{key}": f"--model.optim.{key}" for key in OPTIM_OPTIONS}
    upgraded = []
    for arg in args:
        flag, sep, value = arg.partition("=")
        if flag in old:
            warnings.warn(
                f"{flag} is now {old[flag]} (the same option); the old flag will be removed.",
                FutureWarning,
                stacklevel=3,
            )
            arg = old[flag] + sep + value
        upgraded.append(arg)
    return upgraded if upgraded != list(args) else args


def upgrade_data_hparams(hparams: dict) -> dict:
    """A checkpoint's ``datamodule_hyper_parameters`` (or a config's ``data`` section) in
    today's format: former option names today's, flat mask options ``masks`` (a new dict;
    ``hparams`` itself when nothing is old)."""
    old_masks = any(key in hparams for key in MASK_OPTIONS)
    if not (old_masks or any(key in hparams for key in RENAMED_DATA_OPTIONS)):
        return hparams
    upgraded = {RENAMED_DATA_OPTIONS.get(key, key): value for key, value in hparams.items() if key not in MASK_OPTIONS}
    if old_masks and upgraded.get("masks") is None:
        upgraded["masks"] = legacy_masks(hparams)
    return upgraded


def upgrade_config(config: dict) -> tuple[dict, list[str]]:
    """A config file's top-level mapping in today's format, and the old keys it moved: flat
    optimiser options of ``model:`` under ``model.optim``, flat mask options of ``data:`` under
    ``data.masks`` (into the file's own ``masks`` if it names one), former ``data.*`` names
    today's. ``config`` itself and ``[]`` when nothing is old."""
    model, data = config.get("model"), config.get("data")
    moved = []
    upgraded = dict(config)
    if isinstance(model, dict) and (flat := [key for key in OPTIM_OPTIONS if key in model]):
        optim = model.get("optim") if isinstance(model.get("optim"), dict) else {}
        upgraded["model"] = {
            **{k: v for k, v in model.items() if k not in flat},
            "optim": {**{k: model[k] for k in flat}, **optim},
        }
        moved += [(f"model.{key}", f"model.optim.{key}") for key in flat]
    if isinstance(data, dict) and any(key in data for key in (*MASK_OPTIONS, *RENAMED_DATA_OPTIONS)):
        flat = [key for key in MASK_OPTIONS if key in data]
        renamed = upgrade_data_hparams({k: v for k, v in data.items() if k != "masks"})
        masks = data.get("masks")
        if flat and isinstance(masks, dict):  # the file names a kind: its options join that kind's
            renamed["masks"] = {
                **masks,
                "init_args": {**legacy_masks(data)["init_args"], **(masks.get("init_args") or {})},
            }
        elif masks is not None:
            renamed["masks"] = masks
        upgraded["data"] = renamed
        moved += [(f"data.{key}", f"data.masks.init_args.{key}") for key in flat]
        moved += [(f"data.{key}", f"data.{new}") for key, new in RENAMED_DATA_OPTIONS.items() if key in data]
    if not moved:
        return config, []
    return upgraded, [f"{old} -> {new}" for old, new in moved]


def upgrade_config_text(text: str, name: str) -> str:
    """The YAML ``text`` of the config file ``name`` with its old keys moved
    (:func:`upgrade_config`) and one FutureWarning listing them; ``text`` itself when none is old."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # the parser reports it
    if not isinstance(config, dict):
        return text
    upgraded, moved = upgrade_config(config)
    if not moved:
        return text
    warnings.warn(
        f"--config {name}: read {', '.join(moved)} under their new names; move them in the file (the old keys will "
        "be removed).",
        FutureWarning,
        stacklevel=2,
    )
    return yaml.safe_dump(upgraded, sort_keys=False)


def mask_option_note(option: str) -> str:
    """The one-line note for a flat mask option ``data.<option>`` from before ``data.masks``."""
    return (
        f"data.{option} is now data.masks.init_args.{option} (data.masks: {{class_path: {IMAGE_MASKS}, or "
        f"{CLIP_MASKS} for clips, init_args: {{{option}: ...}}}}): move it in your config or flag"
    )


def projector_slot(regularizers: list[dict]) -> int | None:
    """Index, among the built members (weight > 0), of the first regulariser config with a
    projector: where a model of these ``regularizers`` keeps the old SIGReg projector."""
    built = [config for config in regularizers if config.get("init_args", {}).get("weight", 1.0) > 0]
    return next((i for i, config in enumerate(built) if config.get("init_args", {}).get("projector")), None)


def upgrade_state_dict(state_dict: dict, regularizers: list[dict]) -> None:
    """Rename, in place, the keys of a state dict older than ``model.regularizers`` for a model
    of these ``regularizers`` configs: ``sigreg_projector.*`` -> ``regularizers.<i>.projector.*``
    (:func:`projector_slot`). Where the model has no projector the keys stay, and loading names
    them as unexpected."""
    old = [key for key in state_dict if key.startswith(PROJECTOR_PREFIX)]
    index = projector_slot(regularizers) if old else None
    if index is None:
        return
    for key in old:
        state_dict[f"regularizers.{index}.projector.{key[len(PROJECTOR_PREFIX) :]}"] = state_dict.pop(key)
