"""A sweep's points: each a dict of overrides (``{"model.optim.lr": "1e-3"}``) of one ``ijepa fit`` run.

A grid (``--grid model.optim.lr=1e-3,3e-4 data.batch_size=64,128``, or a YAML/JSON mapping of lists)
is the cartesian product of its lists; a list of points (a YAML/JSON list of mappings) is taken
as it is.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import yaml


class SweepError(ValueError):
    """A sweep the user wrote that cannot be read; the message names the flag or file."""


def grid_points(grid: dict[str, list]) -> list[dict[str, str]]:
    keys = list(grid)
    return [dict(zip(keys, map(override_value, values))) for values in itertools.product(*grid.values())]


def parse_grid(items: list[str]) -> list[dict[str, str]]:
    """``["model.optim.lr=1e-3,3e-4", ...]`` from the command line: the product of the lists."""
    grid: dict[str, list] = {}
    for item in items:
        key, _, values = item.partition("=")
        key = key.removeprefix("--")
        if not key or not values or any(not value for value in values.split(",")):
            raise SweepError(f"--grid: {item!r} is not KEY=VALUE[,VALUE...] (e.g. model.optim.lr=1e-3,3e-4).")
        if key in grid:
            raise SweepError(f"--grid: {key} is given twice; list all its values in one KEY=V1,V2.")
        grid[key] = values.split(",")
    return grid_points(grid)


def read_sweep_file(path: str) -> list[dict[str, str]]:
    """A YAML or JSON file: a mapping of lists (a grid) or a list of mappings (the points)."""
    file = Path(path)
    if not file.is_file():
        raise SweepError(f"--sweep-file {path}: no such file.")
    try:
        content = yaml.safe_load(file.read_text())  # JSON is YAML
    except yaml.YAMLError as error:
        raise SweepError(f"--sweep-file {path}: not YAML or JSON ({str(error).splitlines()[0]}).") from error
    shape = (
        "a mapping of KEY: [values] (a grid) or a list of mappings of KEY: value (the points), "
        "e.g. {model.optim.lr: [1e-3, 3e-4]} or [{model.optim.lr: 1e-3}, {model.optim.lr: 3e-4, data.batch_size: 64}]"
    )
    if isinstance(content, dict) and content and all(isinstance(v, list) and v for v in content.values()):
        return grid_points({str(k).removeprefix("--"): v for k, v in content.items()})
    if isinstance(content, list) and content and all(isinstance(p, dict) and p for p in content):
        return [{str(k).removeprefix("--"): override_value(v) for k, v in point.items()} for point in content]
    raise SweepError(f"--sweep-file {path}: must be {shape}.")


def override_value(value) -> str:
    """The text of a value as the ``ijepa`` command reads it (jsonargparse reads JSON and YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def override_args(point: dict[str, str]) -> list[str]:
    return [f"--{key}={value}" for key, value in point.items()]
