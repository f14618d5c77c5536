"""Lightning's SLURM requeue, moved to a step boundary.

Under SLURM (``SLURMEnvironment``, ``auto_requeue=True``, Lightning's default there) Lightning
handles the requeue signal (``SIGUSR1``; ``ijepa submit`` asks SLURM to send it ``--signal-delay``
seconds before the time limit) by saving ``hpc_ckpt_<n>.ckpt`` in ``trainer.default_root_dir``
and calling ``scontrol requeue``; the requeued job's ``fit`` resumes from the newest
``hpc_ckpt_*`` there. It does so inside the signal handler, wherever the main thread is: between
the optimizer step and the EMA update, between two parameter groups of AdamW, or with a batch
taken from the loader but not trained. Such a file does not resume exactly.
"""

from __future__ import annotations

import signal
import threading

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback


class StepBoundaryRequeue(Callback):
    """Lets Lightning's SLURM requeue handler run at the end of a training batch, after the other
    callbacks' ``on_train_batch_end`` (the EMA update), where ``ModelCheckpoint``'s step
    checkpoints are taken and resume bit-exactly. Lightning's handler still does all of it (the
    ``hpc_ckpt`` file, ``scontrol requeue``); this callback only delays it. Under DDP the ranks
    agree on the step (any rank that got the signal), so every rank joins the same save.

    The signal is deferred from ``on_train_start`` on; one that arrives between Lightning's
    registration and then (data set-up, the step-0 probes) is handled at once, at step 0, where
    nothing has been trained. Without SLURM, or with ``auto_requeue=False``, it does nothing.
    """

    def __init__(self) -> None:
        self._handler = None
        self._signum = None
        self._received = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        environment = getattr(trainer.strategy, "cluster_environment", None)
        signum = environment.requeue_signal if isinstance(environment, SLURMEnvironment) else signal.SIGUSR1
        handler = signal.getsignal(signum)
        # Lightning registers a handler only under SLURM with auto_requeue, and only in the main thread
        if (
            not SLURMEnvironment.detect()
            or not callable(handler)
            or threading.current_thread() != threading.main_thread()
        ):
            return
        self._handler, self._signum, self._received = handler, signum, False
        signal.signal(signum, self._defer)

    def _defer(self, signum, frame) -> None:
        self._received = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._handler is None:
            return
        if trainer.strategy.reduce_boolean_decision(self._received, all=False):
            self._received = False
            self._handler(self._signum, None)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning restores the handlers it replaced at teardown; the deferral ends with training
        if self._handler is not None and signal.getsignal(self._signum) == self._defer:
            signal.signal(self._signum, self._handler)
        self._handler = None
