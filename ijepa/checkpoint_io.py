"""The import path of :class:`ijepa.checkpoint.AtomicCheckpointIO` before it moved, kept so that the
``config.yaml`` files of earlier runs (which name ``ijepa.checkpoint_io.AtomicCheckpointIO`` as
the CLI's plugin) still load. New code imports :mod:`ijepa.checkpoint`."""

from ijepa.checkpoint import AtomicCheckpointIO

__all__ = ["AtomicCheckpointIO"]
