"""Blending: the interleaving follows the weights within one sample at every prefix, within two
over any window, deterministically and resumably; bad weights and stages are refused."""

from __future__ import annotations

import numpy as np
import pytest

from kenotron.data.blend import Interleaver, Stage, check_stages, check_weights


def counts(choice: np.ndarray, k: int) -> np.ndarray:
    """[n + 1, k]: how many of the first n samples came from each dataset."""
    onehot = np.zeros((len(choice) + 1, k), dtype=np.int64)
    for d in range(k):
        onehot[1:, d] = np.cumsum(choice == d)
    return onehot


@pytest.mark.parametrize("seed", range(12))
def test_mixture_follows_the_weights_within_one_sample_at_every_prefix(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 7))
    weights = check_weights(list(rng.random(k) ** 3 + 1e-3), "test")
    n = 1500
    c = counts(Interleaver(weights).next(n), k)
    ideal = np.outer(np.arange(n + 1), weights)
    assert np.abs(c - ideal).max() < 1 - 1 / (2 * k - 2) + 1e-9  # Tijdeman's bound
    for window in (1, 7, 64, 333):
        assert np.abs((c[window:] - c[:-window]) - window * np.array(weights)).max() < 2


def test_zero_weight_datasets_are_never_drawn():
    choice = Interleaver(check_weights([0.0, 3.0, 0.0, 1.0], "t")).next(400)
    assert set(choice.tolist()) == {1, 3}
    assert (choice == 1).sum() == 300


def test_resumed_interleaving_continues_exactly():
    weights = check_weights([0.5, 0.3, 0.2], "t")
    whole = Interleaver(weights).next(100)
    first = Interleaver(weights)
    head = first.next(37)
    resumed = Interleaver(weights)
    resumed.load_state_dict(first.state_dict())
    assert np.array_equal(np.concatenate([head, resumed.next(63)]), whole)


def test_bad_weights():
    with pytest.raises(ValueError, match="data.sources weights: weight -0.5 is negative"):
        check_weights([1.0, -0.5], "data.sources weights")
    with pytest.raises(ValueError, match="the weights are all zero"):
        check_weights([0.0, 0.0], "x")


def test_bad_stages():
    with pytest.raises(ValueError, match="starts at step 5; it must start at step 0"):
        check_stages([Stage(5, (1.0,), 8)])
    with pytest.raises(ValueError, match="starting at step 10 comes after the one starting at step 20"):
        check_stages([Stage(0, (1.0,), 8), Stage(20, (1.0,), 8), Stage(10, (1.0,), 8)])
