"""Every checkpoint a run reads, named or resolved (--ckpt_path last), gets the same safe reading:
tensors only unless the user named the file and trusts it, a truncated file answered with an
intact earlier one, a bare state dict told apart, each in one line."""

import fractions

import pytest
import torch
import yaml
from conftest import TINY_CONFIG, TINY_MODEL

from ijepa.checkpoint import AtomicCheckpointIO
from ijepa.cli import main
from ijepa.module import IJEPA

CONFIG = str(TINY_CONFIG)


def pickled(path):
    """A checkpoint whose payload needs unpickling beyond tensors (a Fraction, harmless here)."""
    torch.save({"state_dict": {}, "note": fractions.Fraction(1, 3)}, path)
    return path


def test_a_pickled_payload_loads_only_from_the_named_file_under_weights_only_false(tmp_path):
    path = pickled(tmp_path / "trusted.ckpt")
    io = AtomicCheckpointIO()
    with pytest.raises(
        ValueError, match=r"refusing to unpickle it, a file the run found itself\. If you trust it, name"
    ):
        io.load_checkpoint(path, weights_only=False)  # resolved by the run: never unpickled
    io.named_path = str(path)
    with pytest.raises(ValueError, match=r"refusing to unpickle it\. If you trust it, add --weights_only false\.$"):
        io.load_checkpoint(path)
    assert io.load_checkpoint(path, weights_only=False)["note"] == fractions.Fraction(1, 3)


def test_a_truncated_checkpoint_names_the_newest_intact_one_beside_it(tmp_path):
    io = AtomicCheckpointIO()
    older = tmp_path / "epoch=0-step=4.ckpt"
    torch.save({"state_dict": {"w": torch.ones(3)}}, older)
    broken = tmp_path / "last.ckpt"
    broken.write_bytes(older.read_bytes()[:100])
    with pytest.raises(ValueError) as error:
        io.load_checkpoint(broken)
    assert str(error.value).startswith(f"cannot read {broken} (")
    assert str(error.value).endswith(
        f"truncated or not a Lightning checkpoint; resume from {older}, an intact earlier checkpoint."
    )


@pytest.fixture
def run_with_last(tmp_path):
    """A 3-step tiny run whose checkpoints sit in a fixed folder, as `--ckpt_path last` needs."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"] = {"dirpath": str(tmp_path / "ckpt"), "save_last": True, "every_n_train_steps": 1}
    config["trainer"].update(max_steps=3, check_val_every_n_epoch=100, logger=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path), f"--trainer.default_root_dir={tmp_path}"])
    return path, tmp_path / "ckpt"


def one_line(capsys, args) -> str:
    with pytest.raises(SystemExit) as exit:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_ckpt_path_last_gets_the_same_reading_as_a_named_path(run_with_last, capsys, tmp_path):
    config, folder = run_with_last
    last = folder / "last.ckpt"
    intact = folder / "previous-last.ckpt"
    assert intact.is_file()
    resume = ["fit", "--config", str(config), f"--trainer.default_root_dir={tmp_path}", "--ckpt_path", "last"]
    resume.append("--trainer.max_steps=5")
    # truncated: the project's message, naming the intact file the save before it kept
    last.write_bytes(intact.read_bytes()[:1000])
    err = one_line(capsys, resume)
    assert err.startswith(f"error: cannot read {last} (") and "an intact earlier checkpoint" in err, err
    # pickled: refused even under --weights_only false, since the run found the file itself
    pickled(last)
    err = one_line(capsys, [*resume, "--weights_only", "false"])
    assert err.startswith(f"error: {last} holds pickled Python objects") and "a file the run found itself" in err, err


def test_a_bare_state_dict_given_to_ckpt_path_says_what_it_is_and_what_loads_it(capsys, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(IJEPA(**TINY_MODEL).state_dict(), path)
    err = one_line(capsys, ["fit", "--config", CONFIG, f"--ckpt_path={path}"])
    assert err.startswith(f"error: ckpt_path={str(path)!r} is a bare state dict (") and "IJEPA.load_state_dict" in err
