"""The validation split and low-shot subsets of ``ijepa eval``: stratified, class-balanced, disjoint,
deterministic given the seed, each class's draw independent of the others, and clear errors."""

import math

import pytest
import torch

from ijepa.evaluation.splits import class_counts, low_shot_indices, validation_split

COUNTS = {0: 30, 1: 12, 2: 7, 5: 20}


def _labels(counts=COUNTS):
    """Labels with the given class sizes, interleaved in a fixed shuffled order."""
    labels = torch.cat([torch.full((n,), c) for c, n in counts.items()])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


def _per_class(labels, indices):
    return class_counts(labels[indices]) if len(indices) else {}


def _check_index_tensor(indices):
    assert indices.dtype == torch.int64 and indices.device.type == "cpu" and indices.dim() == 1
    assert torch.equal(indices, indices.sort().values) and len(indices.unique()) == len(indices)


def test_validation_split_is_stratified_and_partitions_the_data():
    labels = _labels()
    train, val = validation_split(labels, 0.2, seed=3)
    for indices in (train, val):
        _check_index_tensor(indices)
    assert torch.equal(torch.cat([train, val]).sort().values, torch.arange(len(labels)))
    assert _per_class(labels, val) == {c: round(0.2 * n) for c, n in COUNTS.items()}
    assert _per_class(labels, train) == {c: n - round(0.2 * n) for c, n in COUNTS.items()}


def test_validation_split_takes_at_least_one_and_never_the_whole_class():
    labels = _labels({0: 2, 1: 3, 2: 40})
    _, val = validation_split(labels, 0.01, seed=0)
    assert _per_class(labels, val) == {0: 1, 1: 1, 2: 1}
    _, val = validation_split(labels, 0.99, seed=0)
    assert _per_class(labels, val) == {0: 1, 1: 2, 2: 39}


def test_validation_split_keeps_a_single_image_class_in_train():
    labels = _labels({0: 1, 1: 10})
    train, val = validation_split(labels, 0.5, seed=0)
    assert _per_class(labels, train) == {0: 1, 1: 5} and _per_class(labels, val) == {1: 5}


def test_validation_split_is_deterministic_and_depends_on_the_seed():
    labels = _labels()
    first, again, other = (validation_split(labels, 0.25, seed) for seed in (7, 7, 8))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_each_class_split_is_independent_of_the_other_classes():
    labels = _labels()
    more = torch.cat([labels, torch.full((15,), 3), torch.tensor([0, 0])])  # a new class, 2 more images of 0
    _, val = validation_split(labels, 0.2, seed=1)
    _, val_more = validation_split(more, 0.2, seed=1)
    for c in (1, 2, 5):
        assert torch.equal(val[labels[val] == c], val_more[more[val_more] == c])
    pool = torch.arange(len(labels))
    shots = low_shot_indices(labels, pool, shots=5, seed=2)
    shots_more = low_shot_indices(more, torch.arange(len(labels) + 15), shots=5, seed=2)
    for c in COUNTS:
        assert torch.equal(shots[labels[shots] == c], shots_more[more[shots_more] == c])


def test_low_shot_takes_exactly_shots_images_of_every_class_in_the_pool():
    labels = _labels()
    train, _ = validation_split(labels, 0.2, seed=0)
    for shots in (1, 5, 6):  # class 2 has 7 - round(1.4) = 6 training images
        subset = low_shot_indices(labels, train, shots=shots, seed=0)
        _check_index_tensor(subset)
        assert _per_class(labels, subset) == {c: shots for c in COUNTS}


def test_low_shot_fraction_takes_max_1_round_fraction_of_each_class():
    labels = _labels()
    pool = torch.arange(len(labels))
    assert _per_class(labels, low_shot_indices(labels, pool, fraction=0.01)) == {c: 1 for c in COUNTS}
    expected = {c: max(1, round(0.1 * n)) for c, n in COUNTS.items()}
    assert _per_class(labels, low_shot_indices(labels, pool, fraction=0.1)) == expected
    assert torch.equal(low_shot_indices(labels, pool, fraction=1.0), pool)


def test_low_shot_subset_is_inside_the_pool_and_disjoint_from_validation():
    labels = _labels()
    train, val = validation_split(labels, 0.3, seed=4)
    for trial in range(5):
        for subset in (
            low_shot_indices(labels, train, shots=4, seed=4, trial=trial),
            low_shot_indices(labels, train, fraction=0.5, seed=4, trial=trial),
        ):
            assert set(subset.tolist()) <= set(train.tolist())
            assert not set(subset.tolist()) & set(val.tolist())


def test_low_shot_is_identical_for_one_seed_and_differs_across_seeds_and_trials():
    labels = _labels()
    pool = torch.arange(len(labels))
    first = low_shot_indices(labels, pool, shots=3, seed=5, trial=1)
    assert torch.equal(first, low_shot_indices(labels, pool, shots=3, seed=5, trial=1))
    assert torch.equal(first, low_shot_indices(labels, pool.flip(0).repeat(2), shots=3, seed=5, trial=1))
    assert not torch.equal(first, low_shot_indices(labels, pool, shots=3, seed=6, trial=1))
    assert not torch.equal(first, low_shot_indices(labels, pool, shots=3, seed=5, trial=2))


def test_class_counts_counts_each_label():
    assert class_counts(_labels()) == COUNTS
    assert class_counts([3, 1, 3]) == {1: 1, 3: 2}


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, math.nan])
def test_validation_fraction_outside_0_1_names_val_fraction_and_its_range(fraction):
    with pytest.raises(ValueError, match=r"^val_fraction must be in \(0, 1\), got"):
        validation_split(_labels(), fraction, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shots": 0}, r"^shots must be >= 1, got 0\."),
        ({"shots": 2.5}, r"^shots must be an int >= 1, got 2\.5\."),
        ({"shots": True}, r"^shots must be an int >= 1, got True\."),
        ({"fraction": 0.0}, r"^fraction must be in \(0, 1\], got 0\.0\."),
        ({"fraction": 1.5}, r"^fraction must be in \(0, 1\], got 1\.5\."),
        ({"shots": 1, "fraction": 0.1}, r"^give exactly one of shots \(.*>= 1\) or fraction \(.*\(0, 1\]\), got both"),
        ({}, r"^give exactly one of shots \(.*>= 1\) or fraction \(.*\(0, 1\]\), got neither"),
    ],
)
def test_low_shot_bad_shots_or_fraction_names_the_parameter_and_its_range(kwargs, message):
    labels = _labels()
    with pytest.raises(ValueError, match=message):
        low_shot_indices(labels, torch.arange(len(labels)), **kwargs)


def test_shots_larger_than_the_smallest_class_names_it_and_the_valid_range():
    labels = _labels()
    with pytest.raises(ValueError) as error:
        low_shot_indices(labels, torch.arange(len(labels)), shots=10)
    assert str(error.value) == (
        "shots=10 is larger than class 2, which has only 7 training images (the smallest class); shots must be in 1..7."
    )


def test_negative_labels_are_an_error_naming_their_positions():
    labels = torch.tensor([0, 1, -1, 1, 0, -1])
    for call in (lambda: validation_split(labels, 0.5, 0), lambda: low_shot_indices(labels, [0, 1], shots=1)):
        with pytest.raises(ValueError, match=r"^labels must be class indices >= 0, got 2 negative .* \[2, 5\]"):
            call()


@pytest.mark.parametrize("pool", [[], [0, 99], [-1, 2]])
def test_pool_outside_the_labels_names_pool_and_its_range(pool):
    with pytest.raises(ValueError, match=r"^pool must hold positions in 0\.\.68 "):
        low_shot_indices(_labels(), torch.tensor(pool, dtype=torch.long), shots=1)
