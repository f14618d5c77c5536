"""Video building blocks: tubelets, 3D sin-cos, M-RoPE with timestamps (ijepa.nn.video)."""

import copy

import pytest
import torch
from conftest import TINY_CLIP_MODEL, save_tiny_checkpoint, tiny_datamodule

from ijepa.data import IJEPADataModule
from ijepa.data.batch import ClipBatch
from ijepa.data.sources import MovingShapesSource
from ijepa.masks import SpatioTemporalMasks
from ijepa.nn.attention import apply_rotary
from ijepa.nn.position import LearnedFlat3DPosition, MropePosition, Sincos3DPosition, mrope_sections
from ijepa.nn.video import TubeletEmbed
from ijepa.nn.vit import VisionTransformer


def index(t, r, c, grid):
    return (t * grid[1] + r) * grid[2] + c


def test_tubelet_tokens_are_row_major_over_time_rows_columns():
    embed = TubeletEmbed(num_frames=4, image_size=16, tubelet_size=2, patch_size=8, in_channels=3, embed_dim=10)
    clips = torch.randn(2, 3, 4, 16, 16)
    tokens = embed(clips)
    assert embed.grid == (2, 2, 2) and tokens.shape == (2, 8, 10)
    w, b = embed.proj.weight, embed.proj.bias  # [D, C, 2, 8, 8]
    for t, r, c in [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]:
        tubelet = clips[:, :, 2 * t : 2 * t + 2, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8]
        expected = torch.einsum("bcthw,dcthw->bd", tubelet, w) + b
        torch.testing.assert_close(tokens[:, index(t, r, c, embed.grid)], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="multiple of tubelet_size=2"):
        TubeletEmbed(num_frames=3, image_size=16, tubelet_size=2)
    with pytest.raises(ValueError, match=r"clips must be \[B, C, T, H, W\]"):
        embed(torch.randn(2, 3, 16, 16))


def test_sincos_3d_inner_products_depend_only_on_offsets():
    position = Sincos3DPosition((4, 5, 5), 64)
    table = position.table()
    grid = (4, 5, 5)
    gram = table @ table.T
    # the same offset (dt, dr, dc) = (1, -2, 1) from different starting tokens
    pairs = [((0, 3, 0), (1, 1, 1)), ((2, 4, 3), (3, 2, 4)), ((1, 2, 2), (2, 0, 3))]
    values = [gram[index(*a, grid), index(*b, grid)] for a, b in pairs]
    assert max(values) - min(values) < 1e-4
    # and different offsets differ
    assert (
        abs(gram[index(0, 0, 0, grid), index(1, 0, 0, grid)] - gram[index(0, 0, 0, grid), index(0, 0, 1, grid)]) > 1e-3
    )
    # V-JEPA's channel split: the first half encodes time only
    assert torch.equal(table[index(2, 0, 0, grid), :32], table[index(2, 4, 3, grid), :32])
    assert not torch.equal(table[index(2, 0, 0, grid), 32:], table[index(2, 4, 3, grid), 32:])


def test_learned_flat_3d_table_is_looked_up_at_the_indices():
    position = LearnedFlat3DPosition((2, 3, 3), 16)
    indices = torch.tensor([[0, 17, 9]])
    torch.testing.assert_close(position(indices)[0], position.table()[[0, 17, 9]])
    with pytest.raises(ValueError, match=r"valid patch indices are 0\.\.17"):
        position(torch.tensor([[18]]))


def rope_1d_angles(positions, head_dim, base=10_000.0):
    """Plain 1D RoPE angles, written independently: theta_j = p * base^(-2j / head_dim)."""
    j = torch.arange(head_dim // 2, dtype=torch.float32)
    return positions.float()[..., None] * base ** (-2 * j / head_dim)


def test_mrope_with_equal_t_h_w_is_1d_rope():
    # The seed's claim: setting t = h = w makes M-RoPE numerically identical to 1-D RoPE.
    position = MropePosition((6, 6, 6), embed_dim=64, num_heads=2)
    p = torch.arange(6)
    diagonal = (p * 6 + p) * 6 + p  # tokens (p, p, p)
    torch.testing.assert_close(position.angles(diagonal[None])[0, 0], rope_1d_angles(p, 32))
    # and on any coordinates with t = h = w, including non-integer ones
    coords = torch.tensor([[[0.5, 0.5, 0.5], [3.25, 3.25, 3.25]]])
    torch.testing.assert_close(
        position.angles_from_coordinates(coords)[0, 0], rope_1d_angles(torch.tensor([0.5, 3.25]), 32)
    )
    assert position.sections == mrope_sections(16) == (4, 6, 6)


def score(position, q, k, q_index, k_index, frame_times=None):
    angles = position.angles(torch.tensor([[q_index, k_index]]), frame_times)
    cos, sin = angles.cos(), angles.sin()
    rotated_q = apply_rotary(q.expand(1, 1, 2, -1), cos, sin)[0, 0, 0]
    rotated_k = apply_rotary(k.expand(1, 1, 2, -1), cos, sin)[0, 0, 1]
    return float(rotated_q @ rotated_k)


def test_mrope_relativity_holds_per_axis():
    position = MropePosition((5, 5, 5), embed_dim=48, num_heads=2, sections=(4, 4, 4))
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(24, generator=generator), torch.randn(24, generator=generator)
    grid = (5, 5, 5)
    for axis in range(3):  # shift both tokens along one axis at a time
        a, b = [1, 2, 0], [0, 1, 3]
        base = score(position, q, k, index(*a, grid), index(*b, grid))
        a[axis] += 1
        b[axis] += 1
        assert abs(score(position, q, k, index(*a, grid), index(*b, grid)) - base) < 1e-4
    # an offset along one axis changes the score, so each axis is really encoded
    same = score(position, q, k, index(1, 1, 1, grid), index(1, 1, 1, grid))
    for moved in [(2, 1, 1), (1, 2, 1), (1, 1, 2)]:
        assert abs(score(position, q, k, index(*moved, grid), index(1, 1, 1, grid)) - same) > 1e-3


def test_mrope_timestamps_align_clips_at_two_frame_rates():
    # The same motion filmed at 10 and at 5 frames per second: 0.2 s after the first frame is
    # frame 2 of the first clip and frame 1 of the second.
    # (times in temporal-position units: the model divides seconds by time_unit = 0.1 s)
    position = MropePosition((4, 2, 2), embed_dim=32, num_heads=1, sections=(8, 4, 4))
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(32, generator=generator), torch.randn(32, generator=generator)
    grid = (4, 2, 2)
    fast = torch.tensor([[0.0, 0.1, 0.2, 0.3]]) / 0.1
    slow = torch.tensor([[0.0, 0.2, 0.4, 0.6]]) / 0.1
    by_time_fast = score(position, q, k, index(2, 0, 0, grid), index(0, 0, 0, grid), fast)
    by_time_slow = score(position, q, k, index(1, 0, 0, grid), index(0, 0, 0, grid), slow)
    assert abs(by_time_fast - by_time_slow) < 1e-4  # same elapsed time, same relative rotation
    by_index_fast = score(position, q, k, index(2, 0, 0, grid), index(0, 0, 0, grid))
    by_index_slow = score(position, q, k, index(1, 0, 0, grid), index(0, 0, 0, grid))
    assert abs(by_index_fast - by_index_slow) > 1e-3  # frame indices would not align them
    coords = position.token_coordinates(torch.tensor([[index(3, 1, 0, grid)]]), slow)
    torch.testing.assert_close(coords, torch.tensor([[[6.0, 1.0, 0.0]]]))  # 0.6 s / 0.1 s


def test_mrope_errors_name_the_parameter():
    with pytest.raises(ValueError, match=r"sections must be 3 non-negative pair counts summing to head_dim / 2 = 16"):
        MropePosition((2, 2, 2), 64, 2, sections=(4, 4, 4))
    position = MropePosition((2, 2, 2), 64, 2)
    with pytest.raises(ValueError, match=r"frame_times must be \[B, 2\]"):
        position.angles(torch.tensor([[0, 1]]), torch.zeros(1, 3))


@pytest.mark.parametrize("temporal_scale", [(1.0, 1.0), (0.4, 0.6)])
def test_spatio_temporal_masks_stay_in_the_grid_and_are_disjoint(temporal_scale):
    from ijepa.masks import SpatioTemporalMaskSampler

    sampler = SpatioTemporalMaskSampler(
        5, 6, num_target_blocks=3, target_scale=(0.1, 0.15), temporal_scale=temporal_scale, min_keep=8
    )
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        context, targets = sampler(16, generator)
        assert context.min() >= 0 and context.max() < 5 * 36 and targets.min() >= 0 and targets.max() < 5 * 36
        assert context.size(1) >= 8
        for b in range(16):
            target_set = set(targets[b].flatten().tolist())
            assert not set(context[b].tolist()) & target_set  # disjoint over time and space
            assert context[b].tolist() == sorted(set(context[b].tolist()))
            for block in targets[b]:  # each block: one spatial block through consecutive frames
                t, plane = block // 36, block % 36
                frames = sorted(set(t.tolist()))
                assert frames == list(range(frames[0], frames[0] + len(frames)))
                per_frame = [set(plane[t == f].tolist()) for f in frames]
                assert all(p == per_frame[0] for p in per_frame)
                if temporal_scale == (1.0, 1.0):
                    assert len(frames) == 5  # V-JEPA's default: through the whole clip
    with pytest.raises(ValueError, match=r"temporal_scale"):
        SpatioTemporalMaskSampler(4, 6, temporal_scale=(0.5, 1.5))
    with pytest.raises(ValueError, match=r"min_keep must be in \[1, 31\] on a 2x4x4 grid, got 500"):
        SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, min_keep=500)
    with pytest.raises(ValueError, match="could not leave min_keep=30 context tokens"):  # valid, but not satisfiable
        SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, target_scale=(0.5, 0.5), min_keep=30)(4)


@pytest.mark.parametrize("pos_embed", ["sincos_3d", "learned_flat_3d", "mrope"])
def test_video_encoder_on_gathered_tokens(pos_embed):
    torch.manual_seed(0)
    encoder = VisionTransformer.for_clips(
        num_frames=4,
        image_size=16,
        tubelet_size=2,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        pos_embed=pos_embed,
    ).eval()
    with torch.no_grad():  # O(1) weights: at init position effects are below float noise
        for p in encoder.parameters():
            p.normal_(0, 0.3)
    clips = torch.randn(2, 3, 4, 16, 16)
    full = encoder(clips)
    assert full.shape == (2, 8, 32)
    indices = torch.tensor([[0, 3, 5], [1, 6, 7]])
    part = encoder(clips, indices)
    assert part.shape == (2, 3, 32)
    # time is encoded: swapping the two tubelet frames changes the features of a fixed token set
    swapped = torch.cat([clips[:, :, 2:], clips[:, :, :2]], dim=2)
    assert not torch.allclose(encoder(swapped).mean(1), full.mean(1), atol=1e-4)
    out = encoder(clips, indices)
    out.square().mean().backward()
    assert all(p.grad is not None for p in encoder.parameters() if p.requires_grad)
    if pos_embed == "mrope":  # timestamps change the temporal rotation, hence the output
        times = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
        with torch.no_grad():
            assert not torch.allclose(
                encoder(clips, indices, frame_times=times * 3), encoder(clips, indices, frame_times=times), atol=1e-5
            )
    with pytest.raises(
        ValueError,
        match=r"position encoding .sincos. works on image grids \(H, W\), not on the grid \(2, 2, 2\); members for this grid: learned_flat_3d, mrope, sincos_3d",
    ):
        VisionTransformer.for_clips(num_frames=4, image_size=16, pos_embed="sincos")


def _circular_centroids(clips: torch.Tensor) -> torch.Tensor:
    """Foreground centroid of every frame on the torus: ``[N, T, 3, H, W] -> [N, T, 2]`` angles."""
    frames = clips.float()
    background = frames.flatten(3).median(dim=3).values[..., None, None]  # per frame and channel
    weight = (frames - background).abs().sum(2)  # [N, T, H, W]
    size = frames.size(-1)
    phase = torch.exp(1j * 2 * torch.pi * torch.arange(size) / size)
    x = (weight * phase[None, None, None, :]).sum((2, 3))
    y = (weight * phase[None, None, :, None]).sum((2, 3))
    return torch.stack([x.angle(), y.angle()], dim=-1)


def test_moving_shapes_need_time_one_frame_does_not_tell_the_direction():
    from ijepa.classifiers import fit_logistic
    from ijepa.data.moving_shapes import MovingShapesClips

    train = MovingShapesClips(240, num_frames=4, image_size=16, split="train", radius=(0.2, 0.3))
    val = MovingShapesClips(120, num_frames=4, image_size=16, split="val", radius=(0.2, 0.3))
    assert torch.equal(train[5][0], train[5][0]) and not torch.equal(
        train[5][0], val[5][0]
    )  # deterministic, split-specific
    assert train[0][0].shape == (4, 3, 16, 16) and train[0][0].dtype == torch.uint8
    assert [train.targets.count(k) for k in range(4)] == [60] * 4

    def stack(dataset):
        clips, labels = zip(*(dataset[i] for i in range(len(dataset))))
        return torch.stack(clips), torch.tensor(labels)

    (train_clips, train_y), (val_clips, val_y) = stack(train), stack(val)

    def accuracy(train_x, test_x):
        layer = fit_logistic(train_x, train_y, 4, l2=1e-2, max_iter=200)
        with torch.no_grad():
            return float((layer(test_x).argmax(1) == val_y).float().mean())

    # One frame: pixels and the object's position are independent of the direction.
    single = accuracy(train_clips[:, 1].flatten(1).float() / 255, val_clips[:, 1].flatten(1).float() / 255)
    position = accuracy(_circular_centroids(train_clips)[:, 1], _circular_centroids(val_clips)[:, 1])
    assert single < 0.45 and position < 0.45  # chance is 0.25

    # Two frames: the centroid's displacement gives the direction away.
    def displacement(clips):
        angles = _circular_centroids(clips)
        step = angles[:, 1:] - angles[:, :-1]
        return torch.atan2(step.sin(), step.cos()).mean(1)  # wrapped to (-pi, pi]

    motion = accuracy(displacement(train_clips), displacement(val_clips))
    assert motion > 0.9


@pytest.mark.parametrize("background", ["texture", "plain", "noisy"])
def test_cached_clips_are_the_clips_rendered_one_at_a_time(background):
    from ijepa.data.moving_shapes import MovingShapesClips

    options = dict(num_frames=3, image_size=16, background=background, num_objects=3, label="shape", fps=5.0)
    alone, cached = MovingShapesClips(6, **options), MovingShapesClips(6, **options, cache=True)
    assert alone.clips is None and cached.clips.shape == (6, 3, 3, 16, 16)
    for i in range(6):
        (a, label_a, times_a), (b, label_b, times_b) = alone[i], cached[i]
        assert torch.equal(a, b) and label_a == label_b and torch.equal(times_a, times_b)


def test_moving_shapes_options():
    from ijepa.data.moving_shapes import MovingShapesClips

    one = MovingShapesClips(4, num_frames=3, image_size=16, background="plain")
    five = MovingShapesClips(4, num_frames=3, image_size=16, background="plain", num_objects=5)
    # the first instance is drawn as with one object; the others add painted pixels that move too
    assert one.clip_parameters(2)["objects"][0]["x0"] == five.clip_parameters(2)["objects"][0]["x0"]
    background = torch.tensor(one.clip_parameters(2)["bg"]).mul(255).view(1, 3, 1, 1)
    painted = lambda clip: ((clip.float() - background).abs().amax(1) > 40).sum()  # noqa: E731
    assert painted(five[2][0]) > painted(one[2][0])
    # the texture background moves with the velocity: frame 1 is frame 0 shifted (up to the
    # shape, the per-frame noise and rounding)
    from ijepa.data.moving_shapes import translating_texture

    texture = translating_texture(torch.randn(3, 16, 16), (2.0, -1.0), 2, 0.1)
    torch.testing.assert_close(texture[1], torch.roll(texture[0], shifts=(-1, 2), dims=(1, 2)), atol=1e-4, rtol=1e-4)
    clip, label, times = MovingShapesClips(4, num_frames=3, image_size=16, fps=5.0)[1]
    assert clip.shape == (3, 3, 16, 16) and label == 1 and torch.allclose(times, torch.tensor([0.0, 0.2, 0.4]))
    for bad, match in (
        (dict(background="busy"), "background must be one of"),
        (dict(num_objects=0), "num_objects must be"),
        (dict(num_objects=(3, 2)), "num_objects must be"),
        (dict(num_objects=(0, 2)), "num_objects must be"),
        (dict(num_objects=(1, 2, 3)), "num_objects must be"),
        (dict(fps=0.0), "fps must be > 0"),
    ):
        with pytest.raises(ValueError, match=match):
            MovingShapesClips(4, **bad)


def test_moving_shapes_draw_each_clips_object_count_from_the_range():
    """``num_objects=(min, max)``: each clip draws its count (every value in the range turns up,
    none outside it), the clip's first object is the one a fixed count draws, and ``(n, n)`` is
    the clip set of ``n``."""
    from ijepa.data.moving_shapes import MovingShapesClips

    ranged = MovingShapesClips(40, num_frames=2, image_size=16, num_objects=(3, 6), label="shape")
    counts = [len(ranged.clip_parameters(i)["objects"]) for i in range(40)]
    assert set(counts) == {3, 4, 5, 6}
    fixed = MovingShapesClips(40, num_frames=2, image_size=16, num_objects=4, label="shape")
    assert ranged.clip_parameters(5)["objects"][0] == fixed.clip_parameters(5)["objects"][0]
    same = MovingShapesClips(40, num_frames=2, image_size=16, num_objects=(4, 4), label="shape")
    assert all(torch.equal(same[i][0], fixed[i][0]) for i in range(5))


def test_noisy_clips_are_the_plain_clips_with_fresh_noise_in_every_frame():
    """``background="noisy"``: the plain clip with its pixel noise raised to the image
    quickstart's (std 0.08 against plain's 0.02, the same draw), drawn anew for each frame."""
    from ijepa.data.moving_shapes import MovingShapesClips

    options = dict(num_frames=3, image_size=32, num_objects=(3, 6), label="shape")
    plain = torch.stack([MovingShapesClips(6, background="plain", **options)[i][0] for i in range(6)]).float()
    noisy = torch.stack([MovingShapesClips(6, background="noisy", **options)[i][0] for i in range(6)]).float()
    difference = (noisy - plain) / 255  # [N, T, 3, H, W], up to clamping at 0 and 1
    assert 0.04 < difference.std() < 0.1
    # fresh noise in every frame: the difference between frames is not the same noise twice
    assert (difference[:, 1] - difference[:, 0]).abs().mean() > 0.03


@pytest.mark.parametrize(
    "pos_embed, mode", [("sincos_3d", "per_block"), ("mrope", "one_pass"), ("learned_flat_3d", "per_block")]
)
def test_a_video_jepa_step_composes_and_learns(pos_embed, mode):
    """Clip encoder + predictor on the 3D grid + spatio-temporal masks: the I-JEPA loss on one
    batch of generated clips falls under AdamW, for per-block and one-pass prediction."""
    import copy

    import torch.nn.functional as F

    from ijepa.data.moving_shapes import MovingShapesClips
    from ijepa.masks import SpatioTemporalMaskSampler
    from ijepa.nn import Predictor, gather_patches

    torch.manual_seed(0)
    data = MovingShapesClips(8, num_frames=4, image_size=16)
    clips = torch.stack([data[i][0] for i in range(8)]).float().div(255).permute(0, 2, 1, 3, 4)  # [B, C, T, H, W]
    encoder = VisionTransformer.for_clips(
        num_frames=4,
        image_size=16,
        tubelet_size=2,
        patch_size=4,
        embed_dim=32,
        depth=2,
        num_heads=2,
        pos_embed=pos_embed,
    )
    target_encoder = copy.deepcopy(encoder).requires_grad_(False)
    predictor = Predictor(encoder.grid, 32, 16, depth=2, num_heads=2, pos_embed=pos_embed, mode=mode)
    sampler = SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, target_scale=(0.15, 0.2), min_keep=4)
    context_indices, target_indices = sampler(8, torch.Generator().manual_seed(0))
    frame_times = torch.tensor([[0.0, 0.2]]).expand(8, -1)  # two temporal tokens, 0.2 s apart
    optimizer = torch.optim.AdamW([*encoder.parameters(), *predictor.parameters()], lr=1e-3)
    losses = []
    for _ in range(12):
        with torch.no_grad():
            features = target_encoder(clips, frame_times=frame_times)
            targets = gather_patches(F.layer_norm(features, (32,)), target_indices.flatten(1)).view(8, 2, -1, 32)
        context = encoder(clips, context_indices, frame_times=frame_times)
        predictions = predictor(context, context_indices, target_indices, frame_times=frame_times)
        loss = F.smooth_l1_loss(predictions, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert predictions.shape == targets.shape == (8, 2, target_indices.size(2), 32)
    assert losses[-1] < 0.85 * losses[0], losses


def test_ijepa_in_clip_mode_trains_pools_and_reloads(tmp_path):

    from ijepa.data.moving_shapes import MovingShapesClips
    from ijepa.masks import SpatioTemporalMaskSampler
    from ijepa.module import IJEPA

    torch.manual_seed(0)
    model = IJEPA(**{**TINY_CLIP_MODEL, "depth": 2}, pos_embed="mrope", predictor_pos_embed="mrope", time_unit=0.2)
    assert model.encoder.is_clip_encoder and model.predictor.num_patches == 2 * 4 * 4
    data = MovingShapesClips(8, num_frames=4, image_size=16)
    clips = torch.stack([data[i][0] for i in range(8)]).float().div(255).permute(0, 2, 1, 3, 4)
    context, targets = SpatioTemporalMaskSampler(2, 4, num_target_blocks=2, target_scale=(0.15, 0.2))(8)
    frame_times = torch.tensor([[0.0, 0.1, 0.2, 0.3]]).expand(8, -1)  # per frame, 10 fps
    batch = ClipBatch(clips, context, targets, frame_times=frame_times)
    optimizer = model.build_optimizer()
    losses = []
    for _ in range(10):
        loss = model.jepa_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert model.features(clips).shape == (8, 32) and model.features(clips, last_blocks=2).shape == (8, 64)
    # Per-frame times reach M-RoPE as one time per tubelet (its first frame's), in units of
    # time_unit: a 5 fps clip's tokens are 0.4 s apart, not 0.2 s, and the features change;
    # shifting all times does not. Near init the attention is almost uniform, so the change is
    # small (about 3e-5 of features about 3): in float32 it sits within 100x of the shift's
    # rounding noise (1e-7 to 4e-7 depending on the machine's kernels). In float64 the shift
    # is invariant to 1e-15 and the change is the same 3e-5, a margin that holds anywhere.
    torch.testing.assert_close(model.token_times(frame_times)["frame_times"], torch.tensor([[0.0, 1.0]]).expand(8, -1))
    exact, clips64, times64 = copy.deepcopy(model).double(), clips.double(), frame_times.double()
    with torch.no_grad():
        at_10fps = exact(clips64, times64)
        shifted = (exact(clips64, times64 + 7.0) - at_10fps).abs().max()
        slowed = (exact(clips64, 2 * times64) - at_10fps).abs().max()
        assert shifted < 1e-10 and slowed > 1e-6, (shifted, slowed)
        # and the probes' path: pooled features see the times too
        pooled = exact.features(clips64, frame_times=times64)
        shifted = (exact.features(clips64, frame_times=times64 + 7.0) - pooled).abs().max()
        slowed = (exact.features(clips64, frame_times=2 * times64) - pooled).abs().max()
        assert shifted < 1e-10 and slowed > 1e-6, (shifted, slowed)
    with pytest.raises(ValueError, match=r"frame_times must be \[B, T\] with T a multiple of tubelet_size=2"):
        model(clips, frame_times[:, :3])
    with pytest.raises(ValueError, match=r"time_unit must be > 0"):
        IJEPA(image_size=16, patch_size=4, num_frames=4, pos_embed="mrope", predictor_pos_embed="mrope", time_unit=0)

    save_tiny_checkpoint(model, tmp_path / "clip.ckpt")
    reloaded = IJEPA.load_from_checkpoint(tmp_path / "clip.ckpt", map_location="cpu")
    torch.testing.assert_close(reloaded.jepa_loss(batch), model.jepa_loss(batch))
    with pytest.raises(ValueError, match="num_frames must be 0"):
        IJEPA(num_frames=-1)


def test_datamodule_clip_mode_batches():
    data = tiny_datamodule(
        source=MovingShapesSource(train_size=32, val_size=16),
        num_frames=4,
        tubelet_size=2,
        image_size=16,
        patch_size=4,
        batch_size=8,
        masks=SpatioTemporalMasks(target_scale=(0.1, 0.15), min_keep=4),
    )
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch.images.shape == (8, 3, 4, 16, 16) and batch.images.dtype == torch.float32
    assert batch.context_indices.max() < 2 * 4 * 4 and batch.target_indices.max() < 2 * 4 * 4
    probe_batch = next(iter(data.probe_test_dataloader()))
    assert probe_batch.images.shape[1:] == (3, 4, 16, 16) and data.num_classes == 4
    with pytest.raises(ValueError, match="num_frames must be > 0 exactly for sources of clips"):
        IJEPADataModule(source=MovingShapesSource())
    with pytest.raises(ValueError, match="must be a positive multiple of tubelet_size=2"):
        IJEPADataModule(source=MovingShapesSource(), num_frames=3)


@pytest.mark.parametrize("pos_embed", ["learned_flat_3d", "sincos_3d", "mrope"])
def test_clip_checkpoints_load_at_another_size_and_frame_count(tmp_path, pos_embed):
    """A clip model trained at 16 px x 4 frames loads at 24 px x 8 frames: ``learned_flat_3d`` is
    resampled trilinearly over (t, r, c), ``sincos_3d`` and ``mrope`` are rebuilt; the tubelet
    itself cannot change."""

    from ijepa.module import IJEPA
    from ijepa.nn.resize import interpolate_3d_table

    torch.manual_seed(0)
    small = IJEPA(**TINY_CLIP_MODEL, pos_embed=pos_embed, predictor_pos_embed=pos_embed)  # 16 px x 4 frames
    save_tiny_checkpoint(small, tmp_path / "small.ckpt")
    large = IJEPA.load_from_checkpoint(tmp_path / "small.ckpt", map_location="cpu", image_size=24, num_frames=8)
    assert large.encoder.grid == (4, 6, 6)
    clips = torch.randn(2, 3, 8, 24, 24)
    assert large.features(clips).shape == (2, 32)
    torch.testing.assert_close(large.encoder.patch_embed.proj.weight, small.encoder.patch_embed.proj.weight)
    if pos_embed == "learned_flat_3d":
        old = small.encoder.position.table().detach()
        expected = interpolate_3d_table(old, (2, 4, 4), (4, 6, 6))
        torch.testing.assert_close(large.encoder.position.table().detach(), expected)
        # trilinear resampling keeps a table that is constant over time, rows and columns constant
        constant = torch.ones(2 * 4 * 4, 3) * torch.tensor([1.0, -2.0, 0.5])
        torch.testing.assert_close(
            interpolate_3d_table(constant, (2, 4, 4), (4, 6, 6)), torch.ones(144, 3) * torch.tensor([1.0, -2.0, 0.5])
        )
        assert interpolate_3d_table(old, (2, 4, 4), (2, 4, 4)) is old  # identity on the same grid
    with pytest.raises(ValueError, match="not the tubelet"):
        IJEPA.load_from_checkpoint(tmp_path / "small.ckpt", map_location="cpu", tubelet_size=4)
