"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``) for the networks.

Each transformer :class:`~ijepa.nn.vit.Block` becomes its own unit (its weights are gathered just
before it runs and freed after), and the rest of a network (patch kernel, position tables, final
norm, the predictor's projections) one more. Parameters become ``DTensor`` s sharded on dim 0
over the mesh, so two networks of the same shape sharded by :func:`shard_network` on the same
mesh hold the same slice of every tensor on each rank: an elementwise update between them (the
EMA of the online encoder into the target) can run on the local shards alone, see
:func:`local_shards`.

FSDP2 gathers a unit's weights in a hook on ``forward``; the methods that stand in for it
(``pooled_features``, ``forward_packed``, ...) are registered with
``register_fsdp_forward_method`` so that they gather them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from ijepa.nn.vit import Block

# What the LightningModule and the callbacks call on an encoder or predictor besides forward.
ENTRY_POINTS = ("pooled_features", "forward_packed", "block_outputs")


def is_sharded(network: nn.Module) -> bool:
    """Whether ``network`` was sharded by ``fully_shard`` (its root is an FSDP unit)."""
    return isinstance(network, FSDPModule)


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D data-parallel mesh to shard over: a 1-D ``mesh`` itself, or the ``data_parallel``
    dimension of Lightning's ``(data_parallel, tensor_parallel)`` mesh, whose tensor-parallel size
    must be 1 (these networks have no tensor-parallel plan)."""
    if mesh.ndim == 1:
        return mesh
    names = mesh.mesh_dim_names or ()
    if "data_parallel" not in names:
        raise ValueError(f"the device mesh has no data_parallel dimension: {names}.")
    others = {name: mesh[name].size() for name in names if name != "data_parallel"}
    if any(size != 1 for size in others.values()):
        raise ValueError(
            f"tensor_parallel_size must be 1 (the encoders and predictor have no tensor-parallel plan), got mesh "
            f"sizes {others}; use trainer.strategy: fsdp2, or ModelParallelStrategy with data_parallel_size set "
            "to the number of processes and tensor_parallel_size: 1."
        )
    return mesh["data_parallel"]


def shard_network(network: nn.Module, mesh: DeviceMesh, entry_points: Sequence[str] = ENTRY_POINTS) -> None:
    """Shard ``network`` in place over the 1-D data-parallel ``mesh``: every transformer block
    its own unit, then the network itself; the ``entry_points`` it has gather its weights as
    ``forward`` does. A network without parameters is left alone."""
    if mesh.ndim != 1:
        raise ValueError(
            f"shard_network needs a 1-D data-parallel mesh, got a {mesh.ndim}-D one {mesh.mesh_dim_names}."
        )
    if is_sharded(network) or not any(True for _ in network.parameters()):
        return
    # reshard_after_forward=True for the root too (FSDP2 keeps a root's weights gathered after
    # forward, for its backward): the target encoder has no backward, and an update between two
    # networks (the EMA) needs both back in shards.
    for module in network.modules():
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh, reshard_after_forward=True)
    fully_shard(network, mesh=mesh, reshard_after_forward=True)
    for name in entry_points:
        if callable(getattr(network, name, None)):
            register_fsdp_forward_method(network, name)


def local_shards(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local part: a ``DTensor`` 's shard on this rank, a plain tensor itself."""
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def check_sharded_alike(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """ValueError unless every pair is either two plain tensors or two ``DTensor`` s with the same
    mesh, placements and local shape (so an elementwise update can run shard by shard)."""
    for name, a, b in zip(names, first, second, strict=True):
        a_dist, b_dist = isinstance(a, DTensor), isinstance(b, DTensor)
        if a_dist != b_dist or (
            a_dist
            and (
                a.device_mesh != b.device_mesh
                or a.placements != b.placements
                or a.to_local().shape != b.to_local().shape
            )
        ):
            raise ValueError(
                f"{name} is sharded differently in the two networks ({_describe(a)} vs {_describe(b)}): "
                "shard both with ijepa.nn.sharding.shard_network on the same mesh."
            )


def _describe(tensor: torch.Tensor) -> str:
    if isinstance(tensor, DTensor):
        return f"DTensor {tuple(tensor.placements)} local {tuple(tensor.to_local().shape)}"
    return "a plain tensor"


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a ``DTensor`` gathered from every rank (a collective: call it on all
    ranks), a plain tensor itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def tensor_sums(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of each whole tensor, ``[n]`` in float32: of sharded ones the local sums all-reduced
    over their mesh in one collective (call it on all ranks)."""
    tensors = list(tensors)
    sums = torch.stack([t.detach().float().sum() for t in local_shards(tensors)])
    meshes = {t.device_mesh for t in tensors if isinstance(t, DTensor)}
    if meshes:
        if len(meshes) > 1:
            raise ValueError("tensor_sums needs every sharded tensor on one mesh.")
        dist.all_reduce(sums, group=meshes.pop().get_group())
    return sums


@contextmanager
def gathered(network: nn.Module) -> Iterator[nn.Module]:
    """Within the block, a sharded ``network`` 's own weights (its root unit: patch kernel,
    position tables, final norm; not its blocks') are whole, as during its forward; a collective,
    so enter it on every rank. Does nothing for an unsharded network."""
    if not is_sharded(network):
        yield network
        return
    network.unshard()
    try:
        yield network
    finally:
        network.reshard()
