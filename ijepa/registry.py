"""Members of a kind found from their classes, never from a literal list: the one registry
mechanism of the package.

Every kind (position encodings, data sources, regularisers, objectives, evaluation protocols)
is a base class; its members are the concrete subclasses defined so far
(:func:`concrete_subclasses`). A family of one file per member imports its files with
:func:`import_modules`. Kinds chosen in YAML by ``class_path`` are built by :func:`from_config`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil


def concrete_subclasses(base: type) -> tuple[type, ...]:
    """``base`` and its subclasses imported so far, in the order they were defined, without the
    abstract ones and those defined inside a function (a test's throwaway class)."""
    found: list[type] = []

    def add(cls: type) -> None:
        if not inspect.isabstract(cls) and "<locals>" not in cls.__qualname__ and cls not in found:
            found.append(cls)
        for subclass in cls.__subclasses__():
            add(subclass)

    add(base)
    return tuple(found)


def class_path(obj) -> str:
    """``module.QualifiedName`` of an object's class, as a ``class_path`` in YAML names it."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def from_config(config: dict, base: type):
    """The member of ``base`` a ``{"class_path", "init_args"}`` dict describes."""
    module, _, name = config["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{config['class_path']} is not a {base.__name__}.")
    return cls(**config.get("init_args", {}))


def import_modules(package: str) -> None:
    """Import every module of ``package`` (a family of one file per member), so that their
    classes are defined before :func:`concrete_subclasses` looks."""
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")
