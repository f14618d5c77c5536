"""The shipped configs' best.ckpt: the validation of the highest k-NN, kept beside last.ckpt, that
resumes and evaluates as last.ckpt does."""

import pytest
import torch
import yaml
from conftest import ROOT, TINY_CONFIG
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ijepa.cli import main
from ijepa.evaluation.runner import main as evaluate

pytestmark = pytest.mark.slow


def best_callback() -> dict:
    """The quickstart's own entry: the test runs what users run."""
    callbacks = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())["trainer"]["callbacks"]
    return next(c for c in callbacks if c["class_path"].endswith("ModelCheckpoint") and "monitor" in c["init_args"])


def test_best_ckpt_holds_the_highest_knn_step_and_resumes_and_evaluates_like_last(tmp_path):
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["trainer"]["callbacks"].insert(0, best_callback())
    config["trainer"].update(max_steps=30, logger=True)
    config["data"]["source"]["init_args"] = {"train_size": 160, "val_size": 200}  # 5 steps an epoch
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path), f"--trainer.default_root_dir={tmp_path}"])

    folder = tmp_path / "lightning_logs" / "version_0"
    events = EventAccumulator(str(folder)).Reload()
    scores = {event.step: event.value for event in events.Scalars("val/knn_top1")}
    assert len(scores) >= 5
    scores.pop(0)  # ModelCheckpoint saves nothing at step 0 (the random init is not ranked)
    best = torch.load(folder / "checkpoints" / "best.ckpt", weights_only=True)
    state = next(v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': 'val/knn_top1'"))
    top = max(scores.values())
    assert float(state["best_model_score"]) == pytest.approx(top)
    # the file is the state at the first validation that reached it (a tie keeps the earlier file); an
    # epoch-end validation logs at its last batch's step, one before the global step the file records
    first_best = min(step for step, value in scores.items() if value == pytest.approx(top))
    assert best["global_step"] == first_best + 1
    assert (folder / "checkpoints" / "last.ckpt").is_file()

    # resumes: the run goes on from the best step to a new max_steps
    resumed = tmp_path / "resumed"
    main(
        [
            "fit",
            "--config",
            str(path),
            f"--trainer.default_root_dir={resumed}",
            f"--ckpt_path={folder / 'checkpoints' / 'best.ckpt'}",
            f"--trainer.max_steps={best['global_step'] + 5}",
        ]
    )
    last = torch.load(next(resumed.rglob("last.ckpt")), weights_only=True)
    assert last["global_step"] == best["global_step"] + 5

    # evaluates
    evaluate(
        [
            "--checkpoint",
            str(folder / "checkpoints" / "best.ckpt"),
            "--output_dir",
            str(tmp_path / "eval"),
            "--accelerator",
            "cpu",
            "--data.source",
            '{"class_path": "ijepa.data.ShapesSource", "init_args": {"train_size": 160, "val_size": 64}}',
            "--data.num_workers",
            "0",
            "--protocols",
            '[{"class_path": "ijepa.evaluation.KNNProtocol", "init_args": {"ks": [5]}}]',
        ]
    )
    assert (tmp_path / "eval" / "knn.json").is_file()
