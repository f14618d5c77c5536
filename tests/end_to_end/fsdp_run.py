"""One run for the FSDP tests (tests/end_to_end/test_fsdp_runs.py):
``python tests/end_to_end/fsdp_run.py OUT MODE``.

MODE ``single``: one process trains the tiny model on fixed global batches of 32 masked images.
MODE ``fsdp``: two CPU processes (gloo, ``FSDP2Strategy``) train the same model on the same
global batches, each rank on its 16 rows; a checkpoint is written after every epoch.
MODE ``resume``: two processes resume the ``fsdp`` run from its epoch-2 checkpoint;
``resume_single``: one process does.

Three epochs of the same two batches (6 optimizer steps). At every step rank 0 records the
global loss (the mean over ranks) and whether the target encoder equals the EMA of the online
encoder computed on whole tensors; at the end, the whole weights (``OUT/<MODE>.pt``).
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from conftest import TINY_MODEL, end_distributed_run, tiny_datamodule, tiny_trainer
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader

from ijepa.callbacks import EMATargetUpdate
from ijepa.checkpoint import AtomicCheckpointIO
from ijepa.data.batch import GridBatch
from ijepa.module import IJEPA
from ijepa.nn.sharding import full_tensor, local_shards
from ijepa.strategy import FSDP2Strategy

GLOBAL_BATCH, BATCHES, EPOCHS = 32, 2, 3
MODEL = dict(
    TINY_MODEL,
    optim={"warmup_steps": 2, "lr": 2e-3},
    # every real token: the statistic does not depend on which rank drew which
    regularizers=[{"class_path": "ijepa.regularizers.SIGReg", "init_args": {"weight": 0.05, "tokens": 1_000_000}}],
)


def global_batches() -> list[GridBatch]:
    """The same masked batches in every process: the project's own data module, seeded."""
    data = tiny_datamodule(train_size=GLOBAL_BATCH * BATCHES, val_size=32, batch_size=GLOBAL_BATCH)
    data.setup("fit")
    loader = data.train_dataloader()
    return [batch for _, batch in zip(range(BATCHES), loader)]


def rank_rows(batch: GridBatch, rank: int, world: int) -> GridBatch:
    rows = GLOBAL_BATCH // world
    return apply_to_collection(batch, torch.Tensor, lambda value: value[rank * rows : (rank + 1) * rows])


def whole(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered whole (a collective when sharded), on CPU."""
    return {name: full_tensor(p.detach()).clone() for name, p in network.named_parameters()}


class Record(L.Callback):
    """After EMATargetUpdate in the callback list: sees each step's updated target."""

    def __init__(self, ema: EMATargetUpdate):
        self.ema, self.losses, self.ema_exact, self.before = ema, [], [], None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before = whole(pl_module.target_encoder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = pl_module.all_gather(outputs["loss"].detach()).mean()
        self.losses.append(float(loss))
        momentum = self.ema.momentum_at(trainer.global_step - 1, int(trainer.estimated_stepping_batches))
        online, target = whole(pl_module.encoder), whole(pl_module.target_encoder)
        self.ema_exact.append(
            all(torch.equal(target[n], self.before[n].lerp(online[n], 1.0 - momentum)) for n in target)
        )


def main(out: Path, mode: str) -> None:
    world = 1 if mode in ("single", "resume_single") else 2
    torch.manual_seed(0)
    model = IJEPA(**MODEL)
    ema = EMATargetUpdate()
    record = Record(ema)
    callbacks = [ema, record]
    if mode == "fsdp":
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_top_k=-1))
    trainer = tiny_trainer(
        out,
        accelerator="cpu",
        devices=world,
        strategy=FSDP2Strategy() if world > 1 else "auto",
        plugins=[AtomicCheckpointIO()],
        max_epochs=EPOCHS,
        limit_val_batches=0,
        use_distributed_sampler=False,
        callbacks=callbacks,
        enable_checkpointing=mode == "fsdp",
    )
    rank = trainer.global_rank
    batches = [rank_rows(batch, rank, world) for batch in global_batches()]
    loader = DataLoader(batches, batch_size=None, shuffle=False)
    ckpt_path = out / "checkpoints" / f"epoch=1-step={2 * BATCHES}.ckpt" if mode.startswith("resume") else None
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    weights = {
        f"{name}.{key}": value
        for name in ("encoder", "target_encoder", "predictor")
        for key, value in whole(getattr(model, name)).items()
    }
    # What this rank holds of the parameters and of AdamW's moments, against the whole.
    params = list(model.parameters())
    moments = [v for state in trainer.optimizers[0].state.values() for v in state.values() if v.dim() > 0]
    held = {
        "parameters": sum(local_shards([p])[0].numel() for p in params) / sum(p.numel() for p in params),
        "adam_moments": sum(local_shards([m])[0].numel() for m in moments) / sum(m.numel() for m in moments),
    }
    if trainer.is_global_zero:
        torch.save(weights, out / f"{mode}.pt")
        report = {
            "held_by_rank0": held,
            "world": trainer.world_size,
            "steps": trainer.global_step,
            "losses": record.losses,
            "ema_exact": record.ema_exact,
        }
        (out / f"{mode}.json").write_text(json.dumps(report))
    end_distributed_run()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
