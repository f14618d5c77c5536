"""Errors of the ``ijepa`` command that start with the option the user set and the reason.

jsonargparse reports a bad value under the union of types it tried, the value given and the
usage of every option (about 150 lines), and a class that refuses an option in its constructor
ends in a traceback. Here the first line names the option: :class:`IJEPAArgumentParser` for
parse errors (with the classes a mistyped class path could have meant), :class:`OptionError`
for what a class refuses when the CLI builds it (:class:`ijepa.cli.IJEPACLI` raises it).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
import sys
import typing
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.cli import LightningArgumentParser

from ijepa.legacy import MASK_OPTIONS, RENAMED_DATA_OPTIONS, mask_option_note, upgrade_config_text
from ijepa.registry import concrete_subclasses

PACKAGE = Path(__file__).resolve().parent
OWN_ERRORS = (ValueError, OSError, ArithmeticError, ImportError)  # the kinds the project raises with its messages


# torch's re-raise of an exception of a DataLoader worker: its message holds the worker's traceback
WORKER_ERROR = re.compile(r"^Caught (\w+) (in DataLoader worker process \d+)\.\nOriginal Traceback", re.S)


def worker_origin(error: BaseException) -> tuple[str, str] | None:
    """``(where, the worker's own message)`` when ``error`` is torch's re-raise of an exception a
    line of the ``ijepa`` package raised in a DataLoader worker; None otherwise."""
    text = str(error)
    match = WORKER_ERROR.match(text)
    files = re.findall(r'File "([^"]+)", line \d+', text)
    if match is None or not files or not Path(files[-1]).resolve().is_relative_to(PACKAGE):
        return None
    last = text.rstrip().rfind(f"\n{match[1]}: ")
    return (match[2], text[last + len(match[1]) + 3 :].strip()) if last >= 0 else None


def one_line(error: BaseException) -> str:
    """What the commands print of an error of the project's: its message, or for one raised in a
    DataLoader worker the worker's message and where (without the traceback around it)."""
    origin = worker_origin(error)
    return f"{origin[1]} ({origin[0]})" if origin else str(error)


def raised_by_project(error: BaseException) -> bool:
    """Whether ``error`` is one of :data:`OWN_ERRORS` raised by a line of the ``ijepa`` package
    (its messages say what to do; a traceback would bury them), not by a library below it; also in
    a DataLoader worker (:func:`worker_origin`)."""
    if not isinstance(error, OWN_ERRORS):
        return False
    if worker_origin(error) is not None:
        return True
    frame, last = error.__traceback__, None
    while frame is not None:
        last, frame = frame, frame.tb_next
    return last is not None and Path(last.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE)


class OptionError(ValueError):
    """An option the run sets is out of its range or not one of its choices; the message's first
    line names it (``trainer.callbacks: KNNProbe: k must be >= 1, got 0.``). ``ijepa`` prints it
    without a traceback and exits with status 2, as for a parse error."""


class IJEPAArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors start with the option and the reason.

    jsonargparse reports a bad value under the union of types it tried, the value given and the
    usage of every option (about 150 lines): the reason, nested a few levels down, ended up far
    from both ends of the output. Here the first line is ``error: <option>: <reason>``, with the
    known classes when a class path does not resolve; jsonargparse's message follows, without
    the usage."""

    def parse_path(self, path, *args, **kwargs):
        """A config file, refused when a mapping in it holds a key twice (YAML keeps the last one
        without a word, so half of what the file says would be ignored)."""
        try:
            text = Path(str(getattr(path, "absolute", path))).read_text()
        except OSError:  # unreadable: jsonargparse says so itself
            return super().parse_path(path, *args, **kwargs)
        values = expanded_values(text)
        if values > MAX_CONFIG_VALUES:
            expands = (
                "forever (an alias inside its own anchor)"
                if values == math.inf
                else f"to {values:,} values, above {MAX_CONFIG_VALUES:,} (reading it would exhaust memory)"
            )
            self.error(
                f"--config {path}: its YAML aliases expand {expands}; write the values out or nest fewer aliases."
            )
        if is_empty_yaml(text):  # jsonargparse: "Unexpected config: " and nothing after it
            self.error(
                f"--config {path}: the file holds no options (it is empty, or only comments); give it some keys."
            )
        for key, value in misplaced_sections(text, self.groups):
            self.error(
                f"{key}: --config {path} gives it {type(value).__name__} {value!r}; it takes a mapping of options "
                f"({key}: {{option: value, ...}}) or the path of a YAML file holding them."
            )
        repeated = duplicate_keys(text)
        if repeated:
            key, first, second = repeated[0]
            self.error(
                f"--config {path}: the key {key!r} is set twice in one mapping (lines {first} and {second}); YAML "
                "would keep the second silently. Keep one of them."
            )
        return super().parse_path(path, *args, **kwargs)

    def parse_string(self, content: str, *args, **kwargs):
        """A config's text, its options of older formats moved to today's names with a one-line
        FutureWarning (:func:`ijepa.legacy.upgrade_config`): a user's config keeps working."""
        name = kwargs.get("path") or (args[0] if args else None) or "<string>"
        return super().parse_string(upgrade_config_text(content, name), *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        parser = getattr(ex, "subcommand_parser", None) or self
        headline = parse_error_headline(parser, message, ex) or renamed_option_headline(message)
        if headline:
            message = f"{headline}\n{message}"
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # raises
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {message}\ntip: `{prog} --help` lists the options.\n")
        sys.exit(2)


class _KeyLines(yaml.SafeLoader):
    """Records, instead of overwriting, a mapping key that comes twice."""

    repeated: list[tuple[object, int, int]]

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, it does not repeat
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        self.repeated.append((key, seen[key], line))
                    seen.setdefault(key, line)
                except TypeError:  # an unhashable key: yaml's own error follows
                    pass
        return super().construct_mapping(node, deep)


# A config expands to a few hundred values; YAML aliases can make a few lines expand to billions.
MAX_CONFIG_VALUES = 1_000_000


def expanded_values(text: str) -> float:
    """How many values (scalars, lists and mappings) the YAML ``text`` holds once every alias is
    expanded, counted on the composed graph without expanding it; ``inf`` for an alias that
    contains itself, 0 for an empty file or text that is not YAML (the parser reports that)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return 0
    counted: dict[int, float] = {}

    def count(node) -> float:
        key = id(node)
        if key in counted:
            return counted[key]
        counted[key] = math.inf  # seen again before it is counted: it contains itself
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [each for pair in node.value for each in pair]
        counted[key] = 1 + sum(count(child) for child in children)
        return counted[key]

    return 0 if root is None else count(root)


def misplaced_sections(text: str, sections) -> list[tuple[str, object]]:
    """``(key, value)`` of each top-level key of the YAML ``text`` that names a section of options
    (``sections``: the parser's groups, as ``model``, ``data``, ``trainer``) but holds neither a
    mapping, a file path nor null: ``model: [1, 2]`` would fail later naming an option inside it."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(config, dict):
        return []
    return [
        (key, value)
        for key, value in config.items()
        if key in sections and value is not None and not isinstance(value, (dict, str))
    ]


def is_empty_yaml(text: str) -> bool:
    """Whether ``text`` is YAML that holds nothing (empty, blank or only comments)."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader) is None
    except yaml.YAMLError:
        return False


def duplicate_keys(text: str) -> list[tuple[object, int, int]]:
    """``(key, first line, repeated line)`` of every key set twice in one mapping of the YAML
    ``text``; ``[]`` for text that is not YAML (the parser reports that itself)."""
    loader = _KeyLines(text)
    loader.repeated = []
    try:
        loader.get_single_data()
    except yaml.YAMLError:
        return []
    finally:
        loader.dispose()
    return sorted(loader.repeated, key=lambda found: found[2])


def renamed_option_headline(message: str) -> str | None:
    """``data.<old> is now data.<new>`` when a parse error is about a renamed option, or a flat mask
    option now under ``data.masks`` (:mod:`ijepa.legacy`)."""
    for old, new in RENAMED_DATA_OPTIONS.items():
        if re.search(rf"\b{old}\b", message):
            return f"data.{old} is now called data.{new} (the same option): rename it in your config or flag"
    for option in MASK_OPTIONS:
        flat = re.search(rf"\bdata\.{option}\b", message)
        if flat or (re.search(rf"\b{option}\b", message) and "masks" not in message):
            return mask_option_note(option)
    return None


def parse_error_headline(parser, message: str, ex: Exception | None) -> str | None:
    """``<key>: <innermost reason>`` of a jsonargparse parse error (None if it names no key), plus
    the classes the key accepts when the reason is a class path that does not resolve."""
    match = re.match(r'Parser key "([^"]+)"', message)
    if match is None or ex is None:
        return None
    key, reason = match.group(1), innermost_error(ex)
    action = next((a for a in parser._actions if a.dest == key), None)
    inner = re.findall(r'Parser key "([^"]+)"', message[match.end() :])
    if inner and message.count("Problem with given class_path") == 1:  # an option of the one class given
        key = ".".join([key, *dict.fromkeys(inner)])  # data.source.train_size, not data.source
    headline = f"{key}: {_first_line(reason)}"
    if isinstance(reason, (ImportError, AttributeError)) or "import path" in str(reason):
        classes = known_classes(getattr(action, "_typehint", None))
        if classes:
            headline += f". Choose one of (a class path, or its name alone): {', '.join(classes)}"
    return headline


def innermost_error(error: BaseException) -> BaseException:
    """The error under those jsonargparse wraps it in: a class's own ValueError, an import error."""
    while (inner := error.__cause__ or error.__context__) is not None and _raised_by_jsonargparse(error):
        error = inner
    return error


def _raised_by_jsonargparse(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("jsonargparse")


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def known_classes(typehint) -> list[str]:
    """Class paths of the concrete subclasses (loaded so far) of the classes in ``typehint``,
    e.g. every data source for ``DataSource | None``, by their shortest import path."""
    found: list[type] = []
    pending = [typehint]
    while pending:
        hint = pending.pop()
        if inspect.isclass(hint) and hint is not type(None):
            found += [cls for cls in concrete_subclasses(hint) if cls not in found]
        pending.extend(typing.get_args(hint))
    paths = [_import_path(cls) for cls in found]
    return [path for path in paths if not any(part.startswith("_") for part in path.split("."))]  # public only


def _import_path(cls: type) -> str:
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):  # ijepa.data.ShapesSource rather than ijepa.data.sources.ShapesSource
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, cls.__name__, None) is cls:
            return f"{module.__name__}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def built_class(error: BaseException) -> type | None:
    """The class whose constructor raised ``error``: the outermost ``__init__`` in its traceback."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "__init__" and "self" in tb.tb_frame.f_locals:
            return type(tb.tb_frame.f_locals["self"])
        tb = tb.tb_next
    return None


class HeldBack(logging.Filter):
    """Holds a logger's records until :meth:`release` (which drops them unless ``emit``)."""

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger, self.records = logger, []
        logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def release(self, emit: bool = True) -> None:
        self.logger.removeFilter(self)
        records, self.records = self.records, []
        for record in records if emit else ():
            self.logger.handle(record)


# The config key of each class the CLI builds outside a class_path.
CLASS_KEYS = ((L.LightningModule, "model"), (L.LightningDataModule, "data"), (L.Trainer, "trainer"))
