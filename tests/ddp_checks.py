"""Callbacks the end-to-end tests add to an ``ijepa fit`` subprocess (``--trainer.callbacks+=ddp_checks.DDPChecks``,
with ``tests/`` on ``PYTHONPATH``): ``DDPChecks`` compares the ranks at every step with ``all_gather`` and rank 0
writes what it saw to JSON; ``KillRank`` and ``SignalSelf`` make a failure or a signal happen at a known step."""

import json
from pathlib import Path

import lightning as L
import torch


class DDPChecks(L.Callback):
    def __init__(self, output: str):
        self.output = output
        self.images_differ, self.masks_differ, self.online_equal, self.target_equal = [], [], [], []
        self.encoded = 0

    def setup(self, trainer, pl_module, stage):
        features = pl_module.features

        def counting(images, *args, **kwargs):  # how many images this rank encodes for the probe
            self.encoded += images.size(0)
            return features(images, *args, **kwargs)

        pl_module.features = counting

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        sums = torch.stack(
            [
                batch.images.sum(),
                batch.context_indices.float().sum(),
                (
                    batch.target_indices.float()
                    * torch.arange(1, batch.target_indices[0].numel() + 1).view(batch.target_indices[0].shape)
                ).sum(),
            ]
        )
        gathered = pl_module.all_gather(sums)  # [2, 3]
        self.images_differ.append(bool(gathered[0, 0] != gathered[1, 0]))
        self.masks_differ.append(bool((gathered[0, 1:] != gathered[1, 1:]).any()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # runs after the optimizer step and after EMATargetUpdate (earlier in the callback list)
        online = torch.cat([p.detach().flatten() for p in pl_module.encoder.parameters()])
        target = torch.cat([p.detach().flatten() for p in pl_module.target_encoder.parameters()])
        gathered_online, gathered_target = pl_module.all_gather(online), pl_module.all_gather(target)
        self.online_equal.append(torch.equal(gathered_online[0], gathered_online[1]))
        self.target_equal.append(torch.equal(gathered_target[0], gathered_target[1]))

    def on_train_end(self, trainer, pl_module):
        encoded = pl_module.all_gather(torch.tensor(self.encoded)).tolist()
        if trainer.is_global_zero:
            Path(self.output).write_text(
                json.dumps(
                    {
                        "world_size": trainer.world_size,
                        "steps": trainer.global_step,
                        "images_differ": self.images_differ,
                        "masks_differ": self.masks_differ,
                        "online_equal": self.online_equal,
                        "target_equal": self.target_equal,
                        "knn_top1": float(trainer.callback_metrics["val/knn_top1"]),
                        "val_loss": float(trainer.callback_metrics["val/loss"]),
                        "encoded_per_rank": encoded,
                    }
                )
            )


class SignalSelf(L.Callback):
    """Send this process ``signum`` (as a scheduler would, from outside) once it has finished
    ``step`` optimizer steps, on ``rank`` only if given: a signal in the middle of a run at a known
    step, where a test that signals on a line of the log races the run's first steps on a loaded machine."""

    def __init__(self, signum: int, step: int, rank: int | None = None):
        self.signum, self.step, self.rank = signum, step, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            import os

            os.kill(os.getpid(), self.signum)


class KillRank(SignalSelf):
    """SIGKILL this process (no Python exit, as the OOM killer or a node failure) when it is
    ``rank`` and has finished ``step`` optimizer steps."""

    def __init__(self, rank: int, step: int):
        import signal

        super().__init__(signal.SIGKILL, step, rank)
