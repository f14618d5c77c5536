"""Relative paths inside a config file are read against the file's own folder, so a config
works from any working directory (a path given on the command line stays relative to it).

A config written before this rule named paths from the repository root (``architecture:
configs/quickstart.yaml``): where the file's folder holds no such path but the working
directory does, that one is taken, so old configs keep working where they worked.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ijepa.option_errors import OptionError


def config_files(namespace) -> list[Path]:
    """The ``--config`` files of a parsed subcommand, in the order given (absolute paths)."""
    found = []
    for entry in namespace.get("config") or []:
        path = getattr(entry, "absolute", None) or str(entry)
        found.append(Path(path))
    return found


def setting_file(files: list[Path], option: str, value) -> Path | None:
    """The last of ``files`` whose YAML sets ``option`` (dotted) to ``value``: the file that
    named it (a later file or the command line overrides an earlier one)."""
    keys = option.split(".")
    for file in reversed(files):
        try:
            node = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None and str(node) == str(value):
            return file
    return None


def read_from(file: Path | str, value: str) -> str:
    """A relative path ``value`` named in ``file``, as this module reads it: from the file's folder,
    else (an older config) from the working directory; the former where neither holds it."""
    if Path(value).is_absolute():
        return str(value)
    places = [Path(file).resolve().parent / value, Path.cwd() / value]
    return str(next((place for place in places if place.exists()), places[0]))


def resolve(namespace, option: str, required: bool = True) -> None:
    """Sets ``namespace[option]``, a relative path named by a config file, to the path from that
    file's folder; ``required``: a path found nowhere is an error naming the option and every
    place looked in (otherwise it stays as given, for its reader to report or create)."""
    value = namespace.get(option)
    if not isinstance(value, (str, Path)) or Path(value).is_absolute():
        return
    file = setting_file(config_files(namespace), option, value)
    places = ([file.parent / value] if file is not None else []) + [Path.cwd() / value]
    found = next((place for place in places if place.exists()), None)
    if found is not None:
        namespace[option] = str(found.resolve()) if file is not None else str(value)
    elif required:
        named = f" (named in {file})" if file is not None else ""
        raise OptionError(
            f"{option}={str(value)!r} not found{named}: looked for {' and '.join(str(p) for p in places)}. A relative "
            "path in a config file is read from that file's folder."
        )


# The path options of the data a config may name: found from the config's folder when they are there,
# else left as given (a data folder may be created later, by a download or a study).
DATA_PATHS = tuple(
    f"data.{source}.init_args.{key}" for source in ("source", "probe_source") for key in ("root", "masks")
)


def resolve_data_paths(namespace) -> None:
    """:func:`resolve` of every :data:`DATA_PATHS` option, none of them required."""
    for option in DATA_PATHS:
        resolve(namespace, option, required=False)
