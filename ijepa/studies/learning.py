"""The learning ablation of ``docs/training.md``: plain I-JEPA and each lever alone.

Every variant is ``configs/quickstart.yaml`` with overrides: ``plain`` undoes every lever
(``configs/ablations/plain_ijepa.yaml``) and each ``+lever`` variant is plain with one lever
switched on. ``+varcov_inorm`` (VICReg's variance-covariance terms on the context tokens with
data2vec's instance-normed targets) is the image quickstart's own resolved config and ``+varcov``
(the terms alone) the video quickstart's (``tests/test_configs.py`` checks both); ``+sigreg_tokens``
is LeJEPA's SIGReg on the same tokens, ``+sigreg_proj`` sees them through an MLP projector, and
``+sigreg_half_proj`` measures half of the SIGReg term each way; ``+varcov_pooled`` and
``+varcov_both`` measure the variance-covariance terms on each image's mean context token
instead of, or as well as, the tokens. Runs go one after another
(two at once on 2 cores halve each other's speed and spoil the wall-time column)::

    python -m ijepa.studies.learning run --root runs/learning --seeds 0 1 2
    python -m ijepa.studies.learning table --root runs/learning

``--data`` picks the data set: ``shapes`` (the quickstart's), ``shapes_sizes`` (one object per
image, radius 0.08-0.3 of the side: a data set of several object sizes) or ``digits`` (scikit-learn's
8x8 scans of handwritten digits, written to an image folder by :func:`write_digits_folder`; needs
``pip install scikit-learn``). The table gives, per variant, the mean over seeds and half the
range between them of ``val/knn_top1`` and ``val/linear_top1`` at step 0 / the middle validation
/ the end, the gain over step 0 of each seed, ``val/rankme`` at the end, and the median wall
time over seeds (robust to one run that shared the cores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PLAIN = "configs/ablations/plain_ijepa.yaml"


def regularizer(kind: str, **init_args) -> str:
    """The override that sets ``model.regularizers`` to one ``ijepa.regularizers.<kind>``."""
    return "--model.regularizers=" + json.dumps(
        [{"class_path": f"ijepa.regularizers.{kind}", "init_args": init_args}], separators=(",", ":")
    )


def sigreg(**options) -> str:
    return regularizer("SIGReg", weight=0.05, **options)


def varcov(**options) -> str:
    return regularizer("VarianceCovariance", weight=0.04, **options)


# Each lever alone, as overrides on top of the plain recipe; "recipe" is the quickstart itself.
VARIANTS: dict[str, list[str]] = {
    "plain": [f"--config={PLAIN}"],
    "+pad": [f"--config={PLAIN}", "--data.masks.init_args.context_policy=pad"],
    "+official_init": [f"--config={PLAIN}", "--model.rescale_residuals=false"],
    "+sigreg_tokens": [f"--config={PLAIN}", sigreg(input="tokens")],
    "+sigreg_pooled": [f"--config={PLAIN}", sigreg(input="pooled")],
    "+sigreg_both": [f"--config={PLAIN}", sigreg(input="both")],
    "+target_avg4": [f"--config={PLAIN}", "--model.target_last_blocks=4"],
    "+target_inorm": [f"--config={PLAIN}", "--model.target_norm=instance"],
    "+varcov": [f"--config={PLAIN}", varcov(input="tokens")],
    "+varcov_pooled": [f"--config={PLAIN}", varcov(input="pooled")],
    "+varcov_both": [f"--config={PLAIN}", varcov(input="both")],
    "+varcov_inorm": [f"--config={PLAIN}", varcov(input="tokens"), "--model.target_norm=instance"],
    "+sigreg_proj": [f"--config={PLAIN}", sigreg(input="tokens", projector=[512, 128])],
    "+sigreg_half_proj": [f"--config={PLAIN}", sigreg(input="tokens", projector=[512, 128], projector_share=0.5)],
    "+sigreg_multimask": [f"--config={PLAIN}", sigreg(input="tokens"), "--data.masks.init_args.masks_per_image=2"],
    "+sigreg_inorm": [f"--config={PLAIN}", sigreg(input="tokens"), "--model.target_norm=instance"],
}

DATA: dict[str, list[str]] = {
    "shapes": [],
    "shapes_sizes": ["--data.source.num_objects=[1,1]", "--data.source.radius=[0.08,0.3]"],
    # 1,437 training images: 12 steps an epoch at batch 128; validate (and so probe: the
    # quickstart's probes run at every validation) every 12 epochs.
    "digits": [
        "--data.source=ijepa.data.ImageFolderSource",
        "--data.source.root={folder}",
        "--trainer.check_val_every_n_epoch=12",
    ],
    # Fashion-MNIST's 2,000 training images (ijepa.studies.fashion): 16 steps an epoch
    "fashion": [
        "--data.source=ijepa.data.ImageFolderSource",
        "--data.source.root={folder}",
        "--trainer.check_val_every_n_epoch=10",
    ],
}


def write_png(image, path: Path | str) -> None:
    """A uint8 image ``[C, H, W]`` (C 1 or 3) as a PNG file, through Pillow (torchvision's image
    encoders are deprecated since 0.29)."""
    from PIL import Image

    array = image.permute(1, 2, 0).contiguous().numpy()
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(path, format="PNG")


def write_digits_folder(root: Path, size: int = 32, masks: Path | None = None) -> Path:
    """scikit-learn's 1,797 handwritten digits (8x8 grey scans, 17 levels) as an image folder
    ``root/{train,val}/<digit>/*.png``, upscaled to ``size`` px RGB; every fifth image of a class
    goes to ``val``. With ``masks``, each image's class mask too, at the same relative path under
    ``masks`` (the layout of ``ImageFolderSource(masks=...)``): ``digit + 1`` where the upscaled
    pixel is darker than mid-grey (ink over half its full strength), 0 elsewhere. Returns ``root``."""
    import torch
    from torchvision.transforms.v2.functional import resize

    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("the digits data set is scikit-learn's: pip install scikit-learn") from error

    digits = load_digits()
    seen: dict[int, int] = {}
    for image, label in zip(digits.images, digits.target):
        rank = seen.get(int(label), 0)
        seen[int(label)] = rank + 1
        split = "val" if rank % 5 == 4 else "train"
        name = Path(split) / str(int(label)) / f"{rank:04d}.png"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pixels = torch.tensor(255 - image * 255 / 16, dtype=torch.float32)[None].expand(3, -1, -1)  # ink dark on white
        pixels = resize(pixels, [size, size], antialias=True)
        write_png(pixels.round().clamp(0, 255).to(torch.uint8), str(root / name))
        if masks is not None:
            # thresholded before rounding, so that the mask is the ink the float image holds
            mask = torch.where(pixels[0] < 127.5, int(label) + 1, 0).to(torch.uint8)[None]
            (masks / name).parent.mkdir(parents=True, exist_ok=True)
            write_png(mask, str(masks / name))
    return root


def run_command(variant: str, seed: int, root: Path, data: str, config: str, digits: Path | None) -> list[str]:
    """The ``ijepa fit`` command line of one run."""
    data_args = [arg.format(folder=digits) for arg in DATA[data]]
    return [
        "ijepa",
        "fit",
        f"--config={config}",
        *VARIANTS[variant],
        *data_args,
        f"--seed_everything={seed}",
        f"--trainer.default_root_dir={root / f'{variant}_s{seed}'}",
        "--trainer.enable_progress_bar=false",
    ]


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in events.Scalars(tag)]


def run_summary(run_dir: Path) -> dict[str, float] | None:
    """Probe scores at step 0, the middle validation and the end, the last RankMe, and the wall time."""
    versions = sorted((run_dir / "lightning_logs").glob("version_*"))
    timing = run_dir / "wall_time.json"
    if not versions or not timing.exists():
        return None
    summary = {"wall_s": json.loads(timing.read_text())["wall_s"]}
    for metric in ("knn_top1", "linear_top1"):
        values = scalars(versions[-1], f"val/{metric}")
        if len(values) < 2:
            return None
        middle = min(values[1:-1] or values[-1:], key=lambda sv: abs(sv[0] - values[-1][0] / 2))  # nearest half-way
        summary |= {f"{metric}_0": values[0][1], f"{metric}_mid": middle[1], f"{metric}_end": values[-1][1]}
        summary[f"{metric}_gain"] = values[-1][1] - values[0][1]
    attentive = scalars(versions[-1], "val/attentive_top1")  # clip configs only
    if len(attentive) >= 2:
        summary |= {"attentive_top1_0": attentive[0][1], "attentive_top1_end": attentive[-1][1]}
    rank = scalars(versions[-1], "val/rankme")
    summary["rankme_0"] = rank[0][1] if rank and rank[0][0] == 0 else float("nan")
    summary["rankme_end"] = rank[-1][1] if rank else float("nan")
    return summary


def cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± half-range`` of ``values`` times ``scale``."""
    scaled = [scale * v for v in values]
    return f"{statistics.mean(scaled):.{digits}f} ± {(max(scaled) - min(scaled)) / 2:.{digits}f}"


def table(root: Path) -> str:
    """The markdown table of every complete variant under ``root``."""
    rows = {variant: [s for d in sorted(root.glob(f"{variant}_s*")) if (s := run_summary(d))] for variant in VARIANTS}
    attentive = any("attentive_top1_0" in r for runs in rows.values() for r in runs)
    lines = [
        "| variant | seeds | k-NN % step 0 / mid / end | k-NN gain (min) | linear % step 0 / mid / end | "
        "linear gain (min) | " + ("attentive % step 0 / end | " if attentive else "") + "`val/rankme` end | "
        "wall s (median) |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if attentive else ""),
    ]
    for variant, runs in rows.items():
        if not runs:
            continue

        def col(key, runs=runs):
            return [r.get(key, float("nan")) for r in runs]

        knn = " / ".join(f"{100 * statistics.mean(col(f'knn_top1_{w}')):.1f}" for w in ("0", "mid", "end"))
        lin = " / ".join(f"{100 * statistics.mean(col(f'linear_top1_{w}')):.1f}" for w in ("0", "mid", "end"))
        lines.append(
            f"| {variant} | {len(runs)} | {knn} | {cell(col('knn_top1_gain'))} ({100 * min(col('knn_top1_gain')):.1f}) | "
            f"{lin} | {cell(col('linear_top1_gain'))} ({100 * min(col('linear_top1_gain')):.1f}) | "
            + (
                f"{100 * statistics.mean(col('attentive_top1_0')):.1f} / {100 * statistics.mean(col('attentive_top1_end')):.1f} | "
                if attentive
                else ""
            )
            + f"{cell(col('rankme_end'), 1.0)} | {statistics.median(col('wall_s')):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--root", type=Path, default=Path("runs/learning"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data", choices=list(DATA), default="shapes")
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--extra", default="", help="more overrides for every run, e.g. '--trainer.max_steps=300'")
    args = parser.parse_args(argv)
    if args.action == "table":
        print(table(args.root))
        return
    digits = write_digits_folder(args.root / "digits_folder") if args.data == "digits" else None
    for seed in args.seeds:
        for variant in args.variants:
            run_dir = args.root / f"{variant}_s{seed}"
            if (run_dir / "wall_time.json").exists():
                continue  # done already: rerunning a study resumes it
            command = run_command(variant, seed, args.root, args.data, args.config, digits) + shlex.split(args.extra)
            print(" ".join(command), flush=True)
            start = time.perf_counter()
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "fit.log", "w") as log:
                subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
            (run_dir / "wall_time.json").write_text(json.dumps({"wall_s": time.perf_counter() - start}))
    print(table(args.root))


if __name__ == "__main__":
    main()
