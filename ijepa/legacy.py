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
* the data option ``knn_batch_size`` (from when the k-NN probe was the only one):
  ``probe_batch_size``, in a checkpoint's ``datamodule_hyper_parameters`` and in a config.

Plain data only (no ijepa import): the position registry at the bottom of the package reads it too.
"""

from __future__ import annotations

import warnings

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

# Former ``data.*`` option names -> today's.
RENAMED_DATA_OPTIONS = {"knn_batch_size": "probe_batch_size"}


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
    returned when nothing is old): flat regulariser options become ``regularizers``, former
    position names today's (with a FutureWarning)."""
    old_options = any(key in hparams for key in REGULARIZER_OPTIONS)
    renamed = [key for key in POSITION_OPTIONS if hparams.get(key) in RENAMED_POSITIONS]
    if not (old_options or renamed):
        return hparams
    upgraded = {key: value for key, value in hparams.items() if key not in REGULARIZER_OPTIONS}
    if old_options:
        upgraded.setdefault("regularizers", legacy_regularizers(hparams))
    for key in renamed:
        upgraded[key] = position_name(hparams[key])
    return upgraded


def upgrade_data_hparams(hparams: dict) -> dict:
    """A checkpoint's ``datamodule_hyper_parameters`` (or a config's ``data`` section) in
    today's format: former option names today's (a new dict; ``hparams`` itself when nothing is old)."""
    if not any(key in hparams for key in RENAMED_DATA_OPTIONS):
        return hparams
    return {RENAMED_DATA_OPTIONS.get(key, key): value for key, value in hparams.items()}


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
