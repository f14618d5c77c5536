"""SIGReg and the variance-covariance terms on two processes: each rank computes the statistic of
the global batch, and its samples' gradients are those of the one-process run."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ijepa.regularizers import SIGReg, VarianceCovariance

pytestmark = pytest.mark.slow  # two spawned processes each: `pytest -m "not slow"` skips them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank: int, world: int, port: int, x: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = x.chunk(world)[rank].clone().requires_grad_(True)
    value = SIGReg(slices=64).statistic(share, step=7)
    # DDP averages parameter gradients over ranks: do the same for the (per-sample) input gradient
    (value / world).backward()
    out[rank] = (value.detach(), share.grad.clone())
    dist.destroy_process_group()


def test_two_ranks_compute_the_global_batch_statistic_and_its_gradient():
    x = torch.randn(96, 16) @ torch.randn(16, 16) * 0.5
    whole = x.clone().requires_grad_(True)
    value = SIGReg(slices=64).statistic(whole, step=7)
    value.backward()
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_rank_worker, args=(2, _free_port(), x, out), nprocs=2, join=True)
    for rank in range(2):
        rank_value, rank_grad = out[rank]
        assert torch.allclose(rank_value, value.detach(), rtol=1e-5)  # every rank: the global statistic
        # a sample's gradient on its rank equals its gradient in the one-process run
        assert torch.allclose(rank_grad, whole.grad.chunk(2)[rank], rtol=1e-4, atol=1e-7)


def _varcov_rank_worker(rank: int, world: int, port: int, x: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = x.chunk(world)[rank].clone().requires_grad_(True)
    value = VarianceCovariance().statistic(share)
    (value / world).backward()  # as DDP averages gradients over ranks
    out[rank] = (value.detach(), share.grad.clone())
    dist.destroy_process_group()


def test_varcov_on_two_ranks_is_the_global_batch_value_and_gradient():
    x = torch.randn(96, 16) @ torch.randn(16, 16) * 0.5 + 0.3
    whole = x.clone().requires_grad_(True)
    value = VarianceCovariance().statistic(whole)
    value.backward()
    out = mp.Manager().dict()
    mp.spawn(_varcov_rank_worker, args=(2, _free_port(), x, out), nprocs=2, join=True)
    for rank in range(2):
        rank_value, rank_grad = out[rank]
        assert torch.allclose(rank_value, value.detach(), rtol=1e-5)
        assert torch.allclose(rank_grad, whole.grad.chunk(2)[rank], rtol=1e-4, atol=1e-6)
