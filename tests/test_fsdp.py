"""FSDP2 in one process: the sharding helpers on a one-process group, and Lightning's FSDP1 strategy
refused by name. The two-process runs (the same losses and weights as one process, checkpoints
resumed exactly, the CLI command the README documents) are tests/end_to_end/test_fsdp_runs.py."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from conftest import TINY_MODEL
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from ijepa.callbacks import EMATargetUpdate
from ijepa.callbacks.ema import ema_update_
from ijepa.module import IJEPA
from ijepa.nn.sharding import data_parallel_mesh, full_tensor, gathered, shard_network, tensor_sums
from ijepa.nn.vit import VisionTransformer


def test_lightnings_fsdp1_strategy_is_refused_with_the_name_of_fsdp2():
    model = IJEPA(**TINY_MODEL)
    model._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ValueError, match="fsdp2"):
        model.setup("fit")


# --- the sharding helpers, on a one-process group ------------------------------------------
@pytest.fixture(scope="module")
def mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()


def tiny_encoder(seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer.for_images(
        image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, pos_embed="learned"
    )


def test_sharded_encoder_entry_points_give_the_unsharded_results(mesh):
    plain, sharded = tiny_encoder(), tiny_encoder()
    shard_network(sharded, mesh)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(sharded(images), plain(images))
        # not forward: registered so that FSDP gathers the weights for them too
        torch.testing.assert_close(sharded.pooled_features(images, 2), plain.pooled_features(images, 2))
        for a, b in zip(sharded.block_outputs(images, 2), plain.block_outputs(images, 2)):
            torch.testing.assert_close(a, b)
    # after each call the weights are back in shards
    assert all(isinstance(p, DTensor) for p in sharded.parameters())


def test_gathered_shows_whole_tables_and_reshards_after(mesh):
    plain, sharded = tiny_encoder(), tiny_encoder()
    shard_network(sharded, mesh)
    with gathered(sharded):
        torch.testing.assert_close(sharded.position.table(), plain.position.table())
    assert isinstance(next(sharded.position.parameters()), DTensor)  # back in shards
    sums = tensor_sums(sharded.parameters())
    torch.testing.assert_close(sums, torch.stack([p.detach().sum() for p in plain.parameters()]))


def test_ema_runs_shard_by_shard_on_networks_sharded_alike(mesh):
    online, target = tiny_encoder(0), tiny_encoder(1)
    expected = {
        n: t.detach().lerp(o.detach(), 0.25) for (n, t), o in zip(target.named_parameters(), online.parameters())
    }
    for network in (online, target):
        shard_network(network, mesh)
    module = SimpleNamespace(encoder=online, target_encoder=target)
    with torch.no_grad():
        ema_update_(*EMATargetUpdate.parameter_pairs(module), momentum=0.75)
    for name, p in target.named_parameters():
        assert isinstance(p, DTensor)
        assert torch.equal(full_tensor(p.detach()), expected[name]), name


def test_ema_refuses_networks_sharded_differently(mesh):
    online, target = tiny_encoder(0), tiny_encoder(1)
    shard_network(online, mesh)  # the target left whole
    with pytest.raises(ValueError, match="sharded differently in the two networks"):
        EMATargetUpdate.parameter_pairs(SimpleNamespace(encoder=online, target_encoder=target))


def test_tensor_parallel_meshes_are_refused_with_the_sizes():
    class Dim:
        def __init__(self, size):
            self._size = size

        def size(self):
            return self._size

    sizes = {"data_parallel": Dim(1), "tensor_parallel": Dim(2)}
    fake = type(
        "Mesh",
        (),
        {
            "ndim": 2,
            "mesh_dim_names": ("data_parallel", "tensor_parallel"),
            "__getitem__": lambda self, name: sizes[name],
        },
    )()
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be 1.*'tensor_parallel': 2"):
        data_parallel_mesh(fake)
