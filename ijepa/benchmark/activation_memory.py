"""Peak memory and time of one training step with and without activation checkpointing:
``python -m ijepa.benchmark.activation_memory [--batch_size 8] [--every 0 1 2] [--device cpu]``.

Each setting runs in a process of its own (a process's peak memory only grows), builds I-JEPA
ViT-B/16 at 224 px (predictor 384 wide, 12 blocks deep, as the official ViT-B config; `--model vit_l16`: ViT-L/16) with
``model.activation_checkpointing`` set, and takes training steps (forward, backward, AdamW) on random images with I-JEPA's masks. On a GPU the peak is the
allocator's (``torch.cuda.max_memory_allocated``); on the CPU it is the process's peak resident
memory during the first step above its resident memory before it, once weights, gradients,
AdamW moments and the batch exist (so what the step adds: activations). Step times are the
median of ``--steps`` further steps. Prints a markdown table and ``ACTMEM {json}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader

from ijepa.data.collate import MaskCollator
from ijepa.masks import MultiBlockMaskSampler
from ijepa.module import IJEPA

VIT_B16 = dict(
    image_size=224,
    patch_size=16,
    embed_dim=768,
    depth=12,
    num_heads=12,
    predictor_embed_dim=384,
    predictor_depth=12,
    predictor_num_heads=12,
)
# I-JEPA's ViT-L/16 at 224 px with the predictor of its ViT-B config (the GPU check's size)
VIT_L16 = {**VIT_B16, "embed_dim": 1024, "depth": 24, "num_heads": 16, "predictor_num_heads": 16}
MODELS = {
    "vit_b16": VIT_B16,
    "vit_l16": VIT_L16,
    "tiny": dict(
        image_size=32,
        patch_size=8,
        embed_dim=32,
        depth=4,
        num_heads=2,
        predictor_embed_dim=16,
        predictor_depth=2,
        predictor_num_heads=2,
    ),
}


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def one_setting(every: int, batch_size: int, steps: int, device: torch.device, name: str = "vit_b16") -> dict:
    """Runs in its own process: the step's extra peak memory and its median time."""
    torch.manual_seed(0)
    options = MODELS[name]
    model = IJEPA(**options, activation_checkpointing=every).to(device)
    optimizer = model.build_optimizer()
    size = options["image_size"]
    sampler = MultiBlockMaskSampler(size // options["patch_size"])
    samples = [(torch.randn(3, size, size), 0) for _ in range(batch_size)]
    batch = next(iter(DataLoader(samples, batch_size=batch_size, collate_fn=MaskCollator(sampler))))
    batch = move_data_to_device(batch, device)

    def step() -> float:
        start = time.perf_counter()
        loss = model.jepa_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    # Gradients and AdamW moments exist before the measured step (a zero-gradient step allocates
    # them), so the step's peak above this point is what the step itself holds: its activations.
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        before = resident_bytes()
        if peak_bytes(device) > before:  # an earlier transient would hide a smaller step peak
            print(
                f"note: the process peaked {(peak_bytes(device) - before) / 2**20:.0f} MiB above the start",
                file=sys.stderr,
            )
    first = step()
    # ru_maxrss is the kernel's high-water mark, updated at its own times: it can trail the current
    # RSS by a few pages, so a step that raised no peak reads as a small negative, i.e. 0
    extra = max(peak_bytes(device) - before, 0)
    seconds = [step() for _ in range(steps)]
    return {"every": every, "peak_bytes": extra, "seconds": statistics.median(seconds), "first_step": first}


def resident_bytes() -> int:
    """The process's resident memory now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run(args: argparse.Namespace) -> dict:
    rows = []
    for every in args.every:  # one process each
        command = [
            sys.executable,
            "-m",
            "ijepa.benchmark.activation_memory",
            "--one",
            str(every),
            "--batch_size",
            str(args.batch_size),
            "--steps",
            str(args.steps),
            "--device",
            args.device,
            "--model",
            args.model,
        ]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(output.strip().splitlines()[-1]))
    base = rows[0]
    for row in rows:
        # a tiny model's step may add no resident page at all: no ratio then
        row["memory_ratio"] = row["peak_bytes"] / base["peak_bytes"] if base["peak_bytes"] > 0 else None
        row["time_ratio"] = row["seconds"] / base["seconds"]
    return {
        "model": {"vit_b16": "ViT-B/16 224 px", "vit_l16": "ViT-L/16 224 px"}.get(args.model, args.model),
        "batch_size": args.batch_size,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="vit_b16", help="tiny: a seconds-long check")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--every", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.one is not None:
        print(json.dumps(one_setting(args.one, args.batch_size, args.steps, torch.device(args.device), args.model)))
        return None
    result = run(args)
    print(f"{result['model']}, batch {result['batch_size']}, {result['device']} ({result['threads']} threads)\n")
    print("| activation_checkpointing | step's peak memory | against off | seconds a step | against off |")
    print("|---|---:|---:|---:|---:|")
    for row in result["rows"]:
        print(
            f"| {row['every']} | {row['peak_bytes'] / 2**30:.2f} GiB | {row['memory_ratio'] or float('nan'):.2f}x | "
            f"{row['seconds']:.2f} | {row['time_ratio']:.2f}x |"
        )
    print("ACTMEM " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
