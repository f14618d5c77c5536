"""A fine-tuned classifier exported to Hugging Face and timm gives its logits there; heads no
format holds are refused in one line, before anything is written."""

import pytest
import timm
import torch
from transformers import IJepaForImageClassification

from ijepa.finetune import FineTuner
from ijepa.finetune.cli import main
from ijepa.finetune.export import export

ARCH = {"image_size": 16, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "pos_embed": "learned"}


def tuned_checkpoint(tmp_path, **options):
    """A fine-tuner whose weights are all away from their init (as after training), saved as a checkpoint."""
    model = FineTuner(architecture=ARCH, num_classes=5, drop_path_rate=0.0, **options)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    path = tmp_path / "tuned.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    return model.merged().eval(), path


@pytest.mark.parametrize("lora", [None, {"rank": 2}])
def test_the_exported_classifier_gives_the_fine_tuned_logits_in_hugging_face_and_timm(tmp_path, lora):
    model, path = tuned_checkpoint(tmp_path, lora=lora)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        ours = model(images)
        export(str(path), str(tmp_path / "hf"), "hf")
        hf, info = IJepaForImageClassification.from_pretrained(tmp_path / "hf", output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        torch.testing.assert_close(hf.eval()(pixel_values=images).logits, ours, rtol=1e-5, atol=1e-5)
        main(["export", str(path), str(tmp_path / "timm"), "timm"])
        vit = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
        torch.testing.assert_close(vit(images), ours, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("head", "named"),
    [
        ({"class_path": "ijepa.finetune.AttentivePoolHead"}, "attentive pooler"),
        ({"class_path": "ijepa.finetune.MeanPoolHead", "init_args": {"fc_norm": True}}, "fc_norm=true"),
    ],
)
def test_a_head_no_format_holds_is_one_line_and_nothing_is_written(tmp_path, capsys, head, named):
    _, path = tuned_checkpoint(tmp_path, head=head)
    for to in ("hf", "timm"):
        with pytest.raises(SystemExit) as exit_:
            main(["export", str(path), str(tmp_path / to), to])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot export this head" in err and named in err
        assert not (tmp_path / to).exists()


def test_an_existing_destination_is_never_written_over(tmp_path):
    _, path = tuned_checkpoint(tmp_path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--overwrite true"):
        export(str(path), str(tmp_path / "hf"), "hf")
    assert (tmp_path / "hf" / "keep.txt").read_text() == "mine"
