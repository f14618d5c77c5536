"""Two CPU processes (gloo) for tests/end_to_end/test_activation_checkpointing.py, launched once:
``python tests/end_to_end/activation_checkpointing_run.py OUT``.

Four short trainings in the same two processes: ``trainer.strategy`` ddp, then fsdp2, each with
``model.activation_checkpointing`` 0 and 1 (model and data as ``ijepa fit --config tests/tiny.yaml``
builds them, with stochastic depth so that the recomputation must replay the RNG). For each,
rank 0 writes ``OUT/<strategy>-<setting>.json`` (the global loss of every step, how often the
blocks of each network ran, whether every block call saw whole weights) and
``OUT/<strategy>-<setting>.pt`` (the whole gradients of the first step and the final weights).
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from conftest import TINY_CONFIG, end_distributed_run, tiny_trainer
from fsdp_run import whole
from torch.distributed.tensor import DTensor

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import instantiate
from ijepa.nn.sharding import full_tensor
from ijepa.nn.vit import Block

STEPS = 3
NETWORKS = ("encoder", "target_encoder", "predictor")
OVERRIDES = ["--data.source.train_size=128", "--data.source.val_size=32", "--model.drop_path_rate=0.2"]


class Record(L.Callback):
    def __init__(self):
        self.losses, self.calls, self.whole_weights, self.grads = [], dict.fromkeys(NETWORKS, 0), True, None

    def on_fit_start(self, trainer, pl_module):
        # Registered after the strategy wrapped and sharded the networks, so FSDP2's own
        # pre-forward hook (which gathers a block's weights) runs first.
        for name in NETWORKS:
            for block in getattr(pl_module, name).modules():
                if isinstance(block, Block):
                    block.register_forward_pre_hook(self.counter(name))

    def counter(self, name):
        def hook(block, args):
            self.calls[name] += 1
            # a recomputation that ran on the local shards would see DTensors here
            self.whole_weights &= not any(isinstance(p, DTensor) for p in block.parameters())

        return hook

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.grads is None:  # every rank: gathering a sharded gradient is a collective
            self.grads = {n: full_tensor(p.grad).clone() for n, p in pl_module.named_parameters() if p.grad is not None}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(pl_module.all_gather(outputs["loss"].detach()).mean()))


def train(out: Path, strategy: str, setting: int) -> None:
    model, data = instantiate(TINY_CONFIG, [*OVERRIDES, f"--model.activation_checkpointing={setting}"])
    record = Record()
    trainer = tiny_trainer(
        out,
        accelerator="cpu",
        devices=2,
        strategy=strategy,  # the names ijepa fit takes for trainer.strategy
        max_steps=STEPS,
        limit_val_batches=0,
        callbacks=[EMATargetUpdate(), record],
    )
    L.seed_everything(0, verbose=False)
    trainer.fit(model, datamodule=data)
    weights = {f"{name}.{k}": v for name in NETWORKS for k, v in whole(getattr(model, name)).items()}
    if trainer.is_global_zero:
        torch.save({"grads": record.grads, "weights": weights}, out / f"{strategy}-{setting}.pt")
        report = {"world": trainer.world_size, "losses": record.losses, "calls": record.calls}
        report["whole_weights"] = record.whole_weights
        (out / f"{strategy}-{setting}.json").write_text(json.dumps(report))


def main(out: Path) -> None:
    for strategy in ("ddp", "fsdp2"):  # Lightning keeps the process group between the fits
        for setting in (0, 1):
            train(out, strategy, setting)
    end_distributed_run()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
