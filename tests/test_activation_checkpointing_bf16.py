"""``model.activation_checkpointing`` under ``trainer.precision: bf16-mixed``: the recomputation runs
under autocast and gives the losses and gradients of the same run without checkpointing."""

import lightning as L
import pytest
import torch
from conftest import TINY_CONFIG, tiny_trainer
from helpers import assert_same

from ijepa.callbacks import EMATargetUpdate
from ijepa.cli import instantiate


class Record(L.Callback):
    """Each step's loss, the first step's gradients, and the dtype of every output of the
    online encoder's and the predictor's block linears, recomputations included."""

    def __init__(self):
        self.losses, self.grads, self.linear_dtypes = [], None, []

    def on_fit_start(self, trainer, pl_module):
        for network in (pl_module.encoder, pl_module.predictor):
            for module in network.transformer.blocks.modules():
                if isinstance(module, torch.nn.Linear):
                    module.register_forward_hook(lambda module, args, out: self.linear_dtypes.append(out.dtype))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


def fit(precision: str, checkpointing: int, root) -> Record:
    overrides = ["--data.source.train_size=64", "--data.source.val_size=32", "--model.drop_path_rate=0.2"]
    model, data = instantiate(TINY_CONFIG, [*overrides, f"--model.activation_checkpointing={checkpointing}"])
    record = Record()
    trainer = tiny_trainer(
        root,
        accelerator="cpu",
        precision=precision,
        max_steps=2,
        limit_val_batches=0,
        callbacks=[EMATargetUpdate(), record],
    )
    L.seed_everything(0, verbose=False)
    trainer.fit(model, datamodule=data)
    return record


def test_bf16_mixed_checkpointed_training_recomputes_under_autocast(tmp_path):
    plain, checkpointed = fit("bf16-mixed", 0, tmp_path), fit("bf16-mixed", 1, tmp_path)
    assert checkpointed.losses == pytest.approx(plain.losses, rel=1e-6)
    assert_same(checkpointed.grads, plain.grads)
    # Lightning runs the backward outside the autocast region; the recomputation re-entered it
    # (torch's checkpoint records the autocast state): the recomputed linears ran in bfloat16 too.
    # (Not every linear runs again: the recomputation stops once it has what the backward needs.)
    assert len(checkpointed.linear_dtypes) > len(plain.linear_dtypes) > 0
    assert set(checkpointed.linear_dtypes) == set(plain.linear_dtypes) == {torch.bfloat16}
