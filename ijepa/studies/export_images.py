"""Export TensorBoard images of a run to PNG files (what ``docs/`` shows comes from real runs).

    python -m ijepa.studies.export_images runs/pos_learned_s0/lightning_logs/version_0 \\
        --tag positions/encoder --output docs/images/positions_learned.png --scale 8

writes the image logged under ``--tag`` at the last step (or ``--step``), enlarged ``--scale``
times with nearest-neighbour sampling so each tile's cells stay sharp.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def logged_image(log_dir: str, tag: str, step: int | None = None) -> tuple[Image.Image, int]:
    """The image logged under ``tag`` at ``step`` (default: the last one) and its step."""
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    if tag not in events.Tags()["images"]:
        raise ValueError(f"no image tag {tag!r} in {log_dir}; it has {sorted(events.Tags()['images'])}.")
    records = events.Images(tag)
    record = records[-1] if step is None else next((r for r in records if r.step == step), None)
    if record is None:
        raise ValueError(f"no {tag!r} image at step {step}; steps: {[r.step for r in records]}.")
    return Image.open(io.BytesIO(record.encoded_image_string)), record.step


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log_dir")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--scale", type=int, default=1)
    args = parser.parse_args(argv)
    image, step = logged_image(args.log_dir, args.tag, args.step)
    if args.scale > 1:
        image = image.resize((image.width * args.scale, image.height * args.scale), Image.NEAREST)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    image.save(output)
    print(f"{args.tag} at step {step} -> {output} ({image.width}x{image.height})")
    return output


if __name__ == "__main__":
    main()
