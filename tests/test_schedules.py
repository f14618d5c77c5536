import math

import pytest

from ijepa.callbacks import EMATargetUpdate
from ijepa.schedules import cosine_schedule, linear_schedule, warmup_cosine_schedule


def test_warmup_cosine_known_values():
    kw = dict(total_steps=110, warmup_steps=10, base_value=1e-3, final_value=1e-6, start_value=2e-4)
    assert warmup_cosine_schedule(0, **kw) == pytest.approx(2e-4)
    assert warmup_cosine_schedule(5, **kw) == pytest.approx(6e-4)
    assert warmup_cosine_schedule(10, **kw) == pytest.approx(1e-3)
    # half way through the cosine part: the mean of base and final
    assert warmup_cosine_schedule(60, **kw) == pytest.approx((1e-3 + 1e-6) / 2)
    assert warmup_cosine_schedule(110, **kw) == pytest.approx(1e-6)
    assert warmup_cosine_schedule(500, **kw) == pytest.approx(1e-6)  # clipped after the end


def test_cosine_weight_decay_known_values():
    assert cosine_schedule(0, 100, 0.04, 0.4) == pytest.approx(0.04)
    assert cosine_schedule(50, 100, 0.04, 0.4) == pytest.approx(0.22)
    assert cosine_schedule(25, 100, 0.04, 0.4) == pytest.approx(0.4 + 0.5 * (0.04 - 0.4) * (1 + math.cos(math.pi / 4)))
    assert cosine_schedule(100, 100, 0.04, 0.4) == pytest.approx(0.4)


def test_linear_and_ema_momentum_known_values():
    assert linear_schedule(0, 1000, 0.996, 1.0) == pytest.approx(0.996)
    assert linear_schedule(500, 1000, 0.996, 1.0) == pytest.approx(0.998)
    ema = EMATargetUpdate(0.996, 1.0)
    assert ema.momentum_at(0, 1000) == pytest.approx(0.996)
    assert ema.momentum_at(250, 1000) == pytest.approx(0.997)
    assert ema.momentum_at(1000, 1000) == pytest.approx(1.0)


def test_ema_rejects_bad_momentum():
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\]"):
        EMATargetUpdate(momentum=1.5)
