import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Every test starts from the same RNG state; two threads keep CI machines comparable."""
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.set_flush_denormal(False)  # IJEPA.setup turns it on process-wide; start every test from the default
    yield


TINY_MODEL = dict(
    image_size=32,
    patch_size=8,
    embed_dim=32,
    depth=2,
    num_heads=2,
    predictor_embed_dim=16,
    predictor_depth=1,
    predictor_num_heads=2,
)
