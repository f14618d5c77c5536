"""The position-encoding family: one base class, one registry, one file per kind.

* :mod:`~ijepa.nn.position.base`: :class:`PositionEncoding` (the interface: three hooks the
  ``Transformer`` calls, options, weight decay, checkpoint resizing), ``none``;
* :mod:`~ijepa.nn.position.tables`: absolute tables added to the tokens (``learned``,
  ``learned_2d``, ``sincos``, ``learned_flat_3d``, ``sincos_3d``);
* :mod:`~ijepa.nn.position.rotary`: RoPE (``rope_axial``, ``rope_mixed``, ``mrope``);
* :mod:`~ijepa.nn.position.relative`: attention-logit bias (``relative_bias``);
* :mod:`~ijepa.nn.position.convolution`: positional convolution (``peg``);
* :mod:`~ijepa.nn.position.registry`: ``POSITION_ENCODINGS`` (config name -> class, found from
  the classes of these files) and :func:`build_position_encoding` (former names:
  :mod:`ijepa.legacy`).
"""

from ijepa.nn.position.base import AdditivePosition, AttentionPositions, NonePosition, PositionEncoding, unravel
from ijepa.nn.position.convolution import PegPosition
from ijepa.nn.position.registry import (
    POSITION_ENCODINGS,
    build_position_encoding,
    position_names,
)
from ijepa.nn.position.relative import RelativeBiasPosition
from ijepa.nn.position.rotary import MropePosition, RopeAxialPosition, RopeMixedPosition, mrope_sections
from ijepa.nn.position.tables import (
    SINCOS_AXIS_ORDERS,
    Learned2DPosition,
    LearnedFlat3DPosition,
    LearnedPosition,
    Sincos3DPosition,
    SincosPosition,
    sincos_3d_table,
    sinusoidal_1d_positions,
    sinusoidal_2d_grid,
)

__all__ = [
    "POSITION_ENCODINGS",
    "SINCOS_AXIS_ORDERS",
    "AdditivePosition",
    "AttentionPositions",
    "Learned2DPosition",
    "LearnedFlat3DPosition",
    "LearnedPosition",
    "MropePosition",
    "NonePosition",
    "PegPosition",
    "PositionEncoding",
    "RelativeBiasPosition",
    "RopeAxialPosition",
    "RopeMixedPosition",
    "Sincos3DPosition",
    "SincosPosition",
    "build_position_encoding",
    "mrope_sections",
    "position_names",
    "sincos_3d_table",
    "sinusoidal_1d_positions",
    "sinusoidal_2d_grid",
    "unravel",
]
