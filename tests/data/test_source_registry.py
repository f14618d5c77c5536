"""The data-source registry: every concrete source, derived from the classes themselves."""

from __future__ import annotations

import inspect

import ijepa.data
from ijepa.data.sources import DataSource, source_kinds


def test_the_source_registry_is_every_exported_concrete_source_once():
    exported = {
        obj
        for obj in vars(ijepa.data).values()
        if inspect.isclass(obj) and issubclass(obj, DataSource) and not inspect.isabstract(obj)
    }
    kinds = source_kinds()
    assert len(kinds) == len(set(kinds)) and exported <= set(kinds)
    assert DataSource not in kinds and all(not inspect.isabstract(cls) for cls in kinds)
    assert {cls.__name__ for cls in kinds} >= {"STL10Source", "ImageFolderSource", "ShardsSource"}
