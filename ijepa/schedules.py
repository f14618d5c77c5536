"""Learning-rate, weight-decay and EMA-momentum schedules as pure functions of the step.

Pure functions of ``(step, total_steps)`` mean a resumed or multi-process run needs no schedule
state beyond ``global_step``.
"""

from __future__ import annotations

import math


def _progress(step: int, start: int, end: int) -> float:
    """Fraction of ``[start, end)`` covered at ``step``, clipped to ``[0, 1]``."""
    if end <= start:
        return 1.0
    return min(max((step - start) / (end - start), 0.0), 1.0)


def cosine_schedule(step: int, total_steps: int, start_value: float, end_value: float) -> float:
    """Half-cosine from ``start_value`` at step 0 to ``end_value`` at ``total_steps``."""
    p = _progress(step, 0, total_steps)
    return end_value + 0.5 * (start_value - end_value) * (1.0 + math.cos(math.pi * p))


def linear_schedule(step: int, total_steps: int, start_value: float, end_value: float) -> float:
    """Straight line from ``start_value`` at step 0 to ``end_value`` at ``total_steps``."""
    return start_value + (end_value - start_value) * _progress(step, 0, total_steps)


def warmup_cosine_schedule(
    step: int, total_steps: int, warmup_steps: int, base_value: float, final_value: float, start_value: float = 0.0
) -> float:
    """Linear warm-up from ``start_value`` to ``base_value`` over ``warmup_steps``, then cosine
    decay to ``final_value`` at ``total_steps`` (the I-JEPA learning-rate schedule)."""
    if step < warmup_steps:
        return start_value + (base_value - start_value) * step / warmup_steps
    return cosine_schedule(step - warmup_steps, total_steps - warmup_steps, base_value, final_value)
