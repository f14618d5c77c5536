"""The interface every position encoding implements, and the two simplest members.

A position encoding covers a token grid (``(H, W)`` for images, ``(T, H, W)`` for clips) and
receives the row-major integer indices ``[B, K]`` of the tokens it sees, never the full grid
implicitly. It acts through up to three hooks that the shared :class:`ijepa.nn.vit.Transformer`
calls, and nothing else in the network knows which member it is:

* ``add_to_tokens``: absolute positions added to the tokens before the first block;
* ``attention_positions``: rotary angles for q/k and/or a bias on the attention logits, handed
  to every attention layer as :class:`AttentionPositions`;
* ``after_block``: a step after a block that may mix tokens (a positional convolution).
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.nn as nn

from ijepa.nn.checks import check_indices, check_positive
from ijepa.nn.resize import Grid, Resizer, check_grid

HOOKS = ("add_to_tokens", "attention_positions", "after_block")

# member -> {grid: the same member built on that grid}, for at_grid. Kept outside the modules so
# that copies (the EMA target encoder is a deepcopy) and state dicts never see them.
_GRID_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class AttentionPositions:
    """What an attention layer needs to know about token positions.

    Attributes:
        rope: optional ``(cos, sin)``, each ``[B, 1 or heads, K, head_dim / 2]``, rotating q and k.
        bias: optional additive attention bias ``[B, heads, K, K]`` (finite values only).
    """

    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    bias: torch.Tensor | None = None


def unravel(indices: torch.Tensor, grid: Grid) -> tuple[torch.Tensor, ...]:
    """Row-major indices ``[B, K]`` -> one coordinate tensor ``[B, K]`` per grid axis
    (``(row, col)`` on ``(H, W)``, ``(t, row, col)`` on ``(T, H, W)``)."""
    coordinates = []
    for size in reversed(grid):
        coordinates.append(indices % size)
        indices = indices // size
    return tuple(reversed(coordinates))


class PositionEncoding(nn.Module):
    """Base class of the family.

    Every member is built as ``cls(grid, embed_dim, num_heads, **options)``, where ``grid`` has
    ``cls.dims`` entries, ``num_heads`` is the attention's head count (used by members that act
    per head, ignored by the others) and ``options`` are the member's own keyword arguments
    (``model.pos_options`` in YAML). A member overrides the hooks it acts through; the defaults
    do nothing, so the base class itself is the "no position" encoding.

    Class attributes:
        name: the config name (``model.pos_embed``); the class is named after it
            (``rope_axial`` -> ``RopeAxialPosition``).
        dims: grid axes the member works on: 2 for images, 3 for clips.
        packable: the member acts on each image's own integer positions alone (no whole-grid
            table, convolution or offset bias), so NaViT's packed sequences can use it
            (:mod:`ijepa.nn.packing`).
    """

    name: str = ""
    dims: int = 2
    packable: bool = False

    def __new__(cls, *args, **kwargs):
        # Remember the member's own options, so at_grid can build the same member on another grid
        # (copy and pickle call __new__ without arguments and restore them with the __dict__).
        self = super().__new__(cls)
        if not args and not kwargs:
            return self
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
        skip = ("self", "grid", "embed_dim", "num_heads")
        object.__setattr__(self, "_build_options", {k: v for k, v in bound.arguments.items() if k not in skip})
        return self

    def __init__(self, grid: Grid, embed_dim: int, num_heads: int = 1):
        super().__init__()
        grid = check_grid(grid, "grid", (self.dims,))
        check_positive(embed_dim, "embed_dim")
        check_positive(num_heads, "num_heads")
        if embed_dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive divisor of the width {embed_dim}.")
        self.grid = grid
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_positions = 1
        for size in grid:
            self.num_positions *= size

    @property
    def grid_height(self) -> int:
        return self.grid[-2]

    @property
    def grid_width(self) -> int:
        return self.grid[-1]

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def coordinates(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Checked row-major ``indices [B, K]`` -> one long coordinate tensor ``[B, K]`` per axis."""
        check_indices(indices, self.num_positions, "indices")
        return unravel(indices.long(), self.grid)

    # ---- the three hooks --------------------------------------------------------------------

    def add_to_tokens(self, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """``tokens [B, K, D]`` at ``indices [B, K]`` -> tokens with absolute positions added."""
        return tokens

    def attention_positions(
        self, indices: torch.Tensor, frame_times: torch.Tensor | None = None
    ) -> AttentionPositions | None:
        """Rotary angles and/or attention bias for tokens at ``indices [B, K]``. ``frame_times
        [B, T]`` are clip timestamps in temporal-position units; members that do not use time
        ignore them."""
        return None

    def after_block(self, block_index: int, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Hook run after transformer block ``block_index`` on ``tokens [B, K, D]``."""
        return tokens

    @classmethod
    def hooks(cls) -> tuple[str, ...]:
        """The hooks this member acts through (those it overrides), in the order they run."""
        return tuple(hook for hook in HOOKS if getattr(cls, hook) is not getattr(PositionEncoding, hook))

    @classmethod
    def options(cls) -> dict[str, object]:
        """The member's own constructor options and their defaults (what ``pos_options`` may set)."""
        skip = {"self", "grid", "embed_dim", "num_heads"}
        return {
            name: parameter.default
            for name, parameter in inspect.signature(cls.__init__).parameters.items()
            if name not in skip and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
        }

    # ---- parameters and checkpoints ---------------------------------------------------------

    def reset_parameters(self) -> None:
        """(Re)draw the member's parameters; the encoders call it after their generic init."""

    def at_grid(self, grid: Grid) -> PositionEncoding:
        """This member on another ``grid``, for one forward pass (FlexiViT's per-step patch size).

        The view is the same member built on ``grid`` (so sin-cos tables and rotary angles are
        computed for it) whose grid-dependent tensors are this member's, brought to ``grid`` by
        :meth:`state_resizers`: the very functions a checkpoint load at that grid applies, so a
        model trained through views equals the resized model at every grid. The tensors keep
        their gradient to this member's parameters; the others are this member's own. Call it
        once per forward pass: the view holds tensors of the current parameters.
        """
        grid = check_grid(grid, "grid", (self.dims,))
        if grid == self.grid:
            return self
        tensors = dict(self.named_parameters())
        device = next(iter(tensors.values()), None)
        device = device.device if device is not None else next((b.device for b in self.buffers()), None)
        views = _GRID_VIEWS.setdefault(self, {})
        view = views.get(grid)
        if view is None or (device is not None and any(b.device != device for b in view.buffers())):
            view = type(self)(grid, self.embed_dim, self.num_heads, **self._build_options)
            view = view.to(device) if device is not None else view
            views[grid] = view
        resizers = view.state_resizers(self.grid)
        for name, tensor in tensors.items():
            path, _, leaf = name.rpartition(".")
            owner = view.get_submodule(path) if path else view
            owner._parameters.pop(leaf, None)  # a plain attribute from now on: the resized tensor
            setattr(owner, leaf, resizers[name](tensor) if name in resizers else tensor)
        return view

    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of the parameters the optimizer must not decay: by
        default all of them, since an encoding's parameters are tables of per-position (or
        per-frequency) values, which weight decay would pull towards "no position" (ViT, timm)."""
        return {name for name, _ in self.named_parameters()}

    def state_resizers(self, old_grid: Grid, mode: str = "bicubic", antialias: bool = False) -> dict[str, Resizer]:
        """How to bring this module's saved tensors from ``old_grid`` to its own grid.

        Returns ``{state-dict key relative to this module: function old tensor -> new tensor}``
        for the grid-dependent tensors only; fixed tables (sin-cos) and rotary angles are
        computed from the grid and need nothing, so the default is empty.
        """
        return {}


class NonePosition(PositionEncoding):
    """No position information (the ablation): the transformer is permutation-equivariant."""

    name = "none"


class AdditivePosition(PositionEncoding):
    """Base of the members that add a ``[N, D]`` table, looked up at the token indices."""

    def table(self) -> torch.Tensor:
        """The full ``[N, D]`` table in row-major order."""
        raise NotImplementedError(f"{type(self).__name__} must implement table()")

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """``indices [B, K]`` -> embeddings ``[B, K, D]``."""
        check_indices(indices, self.num_positions, "indices")
        return self.table()[indices.long()]

    def full_grid(self, batch_size: int = 1) -> torch.Tensor:
        """Embeddings of every grid position, ``[batch_size, N, D]``."""
        return self.table().unsqueeze(0).expand(batch_size, -1, -1)

    def add_to_tokens(self, tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return tokens + self(indices)
