"""Checks of a run against this machine, made before anything is built or launched.

Lightning starts one process per device in ``trainer.fit`` (and validate, test, predict), each
of which builds the model again, and a data source reads its folder only in ``setup``, in every
process. A run that asks for devices this machine does not have, or whose data folder does not
exist, failed there: a 16-GPU preset on a CPU machine with ``--trainer.accelerator cpu`` started
eight 3-4 GB processes and ran out of memory without naming ``data.source.root``; on one 8-GPU
node its second node never joins. :func:`check_run` reads the subcommand's config alone, in the
launching process, before the classes are built (:class:`ijepa.cli.IJEPACLI` calls it): the
device count, the number of nodes and the data sources' folders (:meth:`DataSource.check`).
"""

from __future__ import annotations

import os
import pydoc

from lightning.fabric.accelerators import MPSAccelerator
from lightning.fabric.accelerators.cuda import num_cuda_devices
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

from ijepa.data.sources import DataSource, STL10Source, source_from_config
from ijepa.option_errors import OptionError

# The cluster environments Lightning detects by itself, and the variables of a launch by hand on every node
CLUSTERS = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)
NODE_VARIABLES = ("NODE_RANK", "GROUP_RANK", "MASTER_ADDR")


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, not the host's count in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolved_accelerator(accelerator) -> str | None:
    """``cuda``, ``mps``, ``cpu`` or ``none`` (``gpu`` on a machine with no GPU) as Lightning
    resolves ``trainer.accelerator``; None for what this module does not check (TPUs, objects)."""
    name = "auto" if accelerator is None else accelerator
    if not isinstance(name, str):
        return None
    name = name.lower()
    if name in ("auto", "gpu"):
        if MPSAccelerator.is_available():
            return "mps"
        if num_cuda_devices() > 0:
            return "cuda"
        return "cpu" if name == "auto" else "none"
    return name if name in ("cuda", "mps", "cpu") else None


def requested_devices(devices, accelerator: str) -> tuple[int, int] | None:
    """``(processes, highest device index + 1)`` that ``trainer.devices`` asks of this node; None
    when it asks for every device there is (``auto``, ``-1``), or for Lightning to refuse itself."""
    if isinstance(devices, str):
        text = devices.strip().strip("[]").strip()
        if text in ("auto", "-1"):
            return None
        try:
            devices = [int(part) for part in text.split(",") if part.strip()] if "," in text else int(text)
        except ValueError:
            return None
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return (devices, devices) if devices > 0 else None
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(d, int) and d >= 0 for d in devices):
        if accelerator == "cpu":
            return None  # CPU devices are a count: Lightning refuses a list itself
        return len(devices), max(devices) + 1
    return None


def names_cluster(plugins) -> bool:
    """Whether ``trainer.plugins`` holds a cluster environment (one given by hand, as Kubeflow's)."""
    for plugin in plugins if isinstance(plugins, (list, tuple)) else [plugins]:
        if isinstance(plugin, ClusterEnvironment):
            return True
        path = plugin if isinstance(plugin, str) else getattr(plugin, "class_path", None)
        found = pydoc.locate(path) if isinstance(path, str) else None
        if isinstance(found, type) and issubclass(found, ClusterEnvironment):
            return True
    return False


def check_devices(accelerator, devices, num_nodes=1, prefix: str = "trainer.") -> None:
    """Refuse a run that asks this machine for more devices than it has: GPUs where there are
    none or fewer, CPU processes beyond the CPU cores (the tests' DDP runs two on two cores).
    ``prefix``: how the options are named (``trainer.`` for the Lightning CLIs, none for ``ijepa eval``)."""
    kind = resolved_accelerator(accelerator)
    if kind is None:
        return
    cores = cpu_cores()
    shown = f"{prefix}accelerator={'auto' if accelerator is None else accelerator}"
    asked = requested_devices("auto" if devices is None else devices, kind)
    nodes = node_count(num_nodes)
    cuda = num_cuda_devices()
    if kind == "none" or (kind == "cuda" and cuda == 0):
        total = f", {prefix}num_nodes={nodes} ({asked[0]} x {nodes} = {asked[0] * nodes} GPUs)" if asked else ""
        raise OptionError(
            f"{shown} with {prefix}devices={devices}{total if nodes > 1 else ''}: this machine has no GPU (0 CUDA "
            f"devices); run it where there are GPUs, or here with --{prefix}accelerator cpu --{prefix}devices 1 "
            f"(at most {cores}, its CPU cores) --{prefix}num_nodes 1."
        )
    if asked is None:
        return
    count, needed = asked
    available, what = {"cuda": (cuda, "CUDA device"), "mps": (1, "MPS device"), "cpu": (cores, "CPU core")}[kind]
    if needed > available:
        index = f" (device index {needed - 1})" if needed > count else ""
        what += "s" if available != 1 else ""
        valid = ("1" if available == 1 else f"1 to {available}") + (", or -1 for all" if kind == "cuda" else "")
        raise OptionError(
            f"{prefix}devices={devices}{index} with {shown}: this machine has {available} {what}, so "
            f"{prefix}devices must be {valid} here" + (" (each device is a process)" if kind == "cpu" else "") + "."
        )


def node_count(num_nodes) -> int:
    return num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else 1


def check_nodes(num_nodes, devices, cluster: bool = False, prefix: str = "trainer.") -> None:
    """Refuse ``trainer.num_nodes > 1`` where nothing starts the other nodes: no cluster
    environment Lightning detects, none named in ``trainer.plugins`` (``cluster``), no variables
    of a launch by hand. The processes of this node would wait for the others forever."""
    nodes = node_count(num_nodes)
    launched = cluster or any(env.detect() for env in CLUSTERS) or any(v in os.environ for v in NODE_VARIABLES)
    if nodes > 1 and not launched:
        raise OptionError(
            f"{prefix}num_nodes={nodes} (with {prefix}devices={devices} each): nothing starts the other {nodes - 1} "
            f"node(s) (no SLURM, torchrun, LSF or MPI job, no {' or '.join(NODE_VARIABLES)} set), so this node's "
            f"processes would wait for them forever; {prefix}num_nodes must be 1 here, or launch the run on every "
            "node (srun, torchrun, ijepa submit --nodes)."
        )


def built_source(config) -> DataSource | None:
    """The data source a ``data.source`` config value describes (null: the DataModule's default,
    STL-10); None when it cannot be built (the CLI then reports the option it refuses)."""
    if config is None:
        return STL10Source()
    if isinstance(config, DataSource):
        return config
    try:
        init_args = config.get("init_args")
        init_args = init_args.as_dict() if hasattr(init_args, "as_dict") else dict(init_args or {})
        return source_from_config({"class_path": config["class_path"], "init_args": init_args})
    except Exception:  # noqa: BLE001  (a bad value: building the classes names it, with the option)
        return None


def check_run(config) -> None:
    """The checks above for ``config``, one subcommand's namespace (``trainer.*``, ``data.*``)."""
    trainer = config.get("trainer")
    if trainer is not None:
        check_devices(trainer.get("accelerator"), trainer.get("devices"), trainer.get("num_nodes"))
        check_nodes(trainer.get("num_nodes"), trainer.get("devices"), names_cluster(trainer.get("plugins")))
    data = config.get("data")
    if data is None:
        return
    for option in ("data.source", "data.probe_source"):
        key = option.removeprefix("data.")
        if option == "data.probe_source" and data.get(key) is None:
            continue
        source = built_source(data.get(key))
        if source is not None:
            source.check(option)
