"""A rank whose peer died stops with a message instead of hanging in its next collective.

On in every ``ijepa`` CLI run (``rank_watchdog`` in the config).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from ijepa.checkpoint import saved_checkpoints
from ijepa.nn.checks import check_range


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (macOS): os.kill said it exists
        return True


class RankWatchdog(Callback):
    """Under multi-process ``fit``, every rank watches the others on its machine: when one stops
    (killed, out of memory, a crash that skipped Python's exit), the rest print which rank went,
    the last intact checkpoint and the ``--ckpt_path`` to resume with, and exit with status 1 within
    ``poll_s`` seconds. Without it a rank can wait in its next all-reduce until the process group's
    timeout (30 minutes by default); where the collective fails first (gloo sees the connection
    reset), the same message follows its error.

    Ranks on other machines are not processes it can see: there the process group's ``timeout``
    (``--trainer.strategy.timeout``) and NCCL's own watchdog bound the wait. The watch ends at a
    barrier when training ends, so ranks leaving one after another are not taken for a failure.
    """

    def __init__(self, poll_s: float = 1.0):
        check_range(poll_s, "poll_s", 0, low_open=True)
        self.poll_s = float(poll_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peers: list[tuple[int, int]] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size < 2 or not dist.is_available() or not dist.is_initialized():
            return
        found: list = [None] * dist.get_world_size()
        dist.all_gather_object(found, (socket.gethostname(), os.getpid()))
        here = socket.gethostname()
        peers = [(rank, pid) for rank, (host, pid) in enumerate(found) if host == here and pid != os.getpid()]
        self._stop.clear()
        self._peers = peers
        self._thread = threading.Thread(target=self._watch, args=(trainer, peers), daemon=True, name="rank-watchdog")
        self._thread.start()

    @staticmethod
    def gone(peers: list[tuple[int, int]]) -> tuple[int, int] | None:
        return next(((rank, pid) for rank, pid in peers if not process_alive(pid)), None)

    def _watch(self, trainer: L.Trainer, peers: list[tuple[int, int]]) -> None:
        while not self._stop.wait(self.poll_s):
            gone = self.gone(peers)
            if gone is not None:
                sys.stderr.write(self.message(trainer, *gone) + "\n")
                sys.stderr.flush()
                os._exit(1)  # this rank may sit inside a collective: no Python unwinding reaches it

    @staticmethod
    def message(trainer: L.Trainer, rank: int, pid: int) -> str:
        saved = saved_checkpoints(trainer)
        if saved:
            step, path = saved[0]
            advice = f"The last checkpoint, {path} (step {step}), is intact: resume with --ckpt_path {path}"
        else:
            advice = "No checkpoint was written yet: the run starts again from step 0"
        return (
            f"error: rank {trainer.global_rank}: rank {rank} (pid {pid}) stopped during training; stopping this rank "
            f"too instead of waiting in its next collective. {advice}."
        )

    def _end(self, trainer: L.Trainer) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._thread is not None:
            trainer.strategy.barrier("rank_watchdog")  # every rank got here: none of them has failed
        self._end(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        watching = self._thread is not None
        self._end(trainer)
        # a collective that failed because a peer died (gloo: "connection reset by peer"): say so
        gone = self.gone(self._peers) if watching else None
        if gone is not None:
            sys.stderr.write(self.message(trainer, *gone) + "\n")
            sys.stderr.flush()
