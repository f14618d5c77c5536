"""LoRA on the encoder's attention and MLP projections through ``peft`` (the ``lora`` extra),
and its merge into plain weights for export.

``peft.inject_adapter_in_model`` wraps each targeted ``nn.Linear`` (``qkv``, ``proj``, ``fc1``,
``fc2`` of every block) in a LoRA layer: ``W x + (alpha / r) B A x`` with ``A`` random and ``B``
zero, so a fresh adapter changes nothing. Only the adapters (and the head) train. :func:`merge_lora`
folds ``(alpha / r) B A`` into ``W`` and puts the plain ``nn.Linear`` back, so the merged encoder is
an ordinary :class:`~ijepa.nn.vit.VisionTransformer` that every export reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn

from ijepa.nn.checks import check_range

TARGETS = ("qkv", "proj", "fc1", "fc2")  # the attention's and the MLP's projections, in every block


@dataclass(frozen=True)
class LoraOptions:
    """``model.lora``: rank ``rank``, scale ``alpha / rank``, dropout on the adapters' input,
    on the ``targets`` among :data:`TARGETS`."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        check_range(self.rank, "model.lora.rank", 1)
        check_range(self.alpha, "model.lora.alpha", 0, low_open=True)
        check_range(self.dropout, "model.lora.dropout", 0, 1, high_open=True)
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(
                f"model.lora.targets must be a non-empty subset of {list(TARGETS)}, got {list(self.targets)}."
            )
        object.__setattr__(self, "targets", tuple(self.targets))

    @classmethod
    def of(cls, value: LoraOptions | dict | None) -> LoraOptions | None:
        return None if value is None else value if isinstance(value, cls) else cls(**value)

    def record(self) -> dict:
        return {**asdict(self), "targets": list(self.targets)}


def require_peft():
    """The ``peft`` module, or one line saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ImportError(
            "model.lora needs the peft package, which is not installed: pip install 'ijepa-lightning[lora]' "
            "(or pip install peft), or set model.lora: null."
        ) from None
    return peft


def add_lora(network: nn.Module, options: LoraOptions) -> nn.Module:
    """``network`` with LoRA adapters on ``options.targets`` of every block, in place; every other
    parameter of it frozen."""
    peft = require_peft()
    config = peft.LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=[rf"transformer\.blocks\.\d+\.(attn|mlp)\.{name}" for name in options.targets],
    )
    # one regex: peft matches target_modules given as a string with re.fullmatch
    config.target_modules = "|".join(f"(?:{pattern})" for pattern in config.target_modules)
    network = peft.inject_adapter_in_model(config, network)
    for name, param in network.named_parameters():
        param.requires_grad_("lora_" in name)
    return network


def has_lora(network: nn.Module) -> bool:
    return any("lora_" in name for name, _ in network.named_parameters())


def merge_lora(network: nn.Module) -> nn.Module:
    """Fold every LoRA adapter of ``network`` into its base ``nn.Linear`` and put that back, in
    place: the same function, as a plain network (no ``peft`` modules left)."""
    if not has_lora(network):
        return network
    peft = require_peft()
    layer_type = peft.tuners.lora.LoraLayer
    for name, module in list(network.named_modules()):
        if isinstance(module, layer_type):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = network.get_submodule(parent_name) if parent_name else network
            setattr(parent, child, module.get_base_layer())
    for param in network.parameters():
        param.requires_grad_(True)
    return network
