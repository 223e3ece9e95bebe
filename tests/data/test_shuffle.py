"""The Feistel permutation behind shuffled tokenized data: a bijection, seeded, new every epoch."""

from __future__ import annotations

import numpy as np
import pytest

from kenotron.data.shuffle import Permutation


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_is_a_permutation_of_every_size(n):
    values = Permutation(n, seed=7)[np.arange(n)]
    assert sorted(values.tolist()) == list(range(n))


def test_depends_only_on_n_seed_and_epoch():
    index = np.arange(500)
    a = Permutation(500, seed=1, epoch=0)[index]
    assert np.array_equal(a, Permutation(500, seed=1, epoch=0)[index])
    assert np.array_equal(a[123:130], Permutation(500, seed=1, epoch=0)[index[123:130]])  # any subset, any order
    assert not np.array_equal(a, Permutation(500, seed=1, epoch=1)[index])
    assert not np.array_equal(a, Permutation(500, seed=2, epoch=0)[index])


def test_order_is_well_mixed():
    n = 10_000
    values = Permutation(n, seed=3)[np.arange(n)]
    # Neighbours land far apart, and the order is far from the identity.
    assert np.median(np.abs(np.diff(values))) > n / 10
    assert abs(np.corrcoef(np.arange(n), values)[0, 1]) < 0.05


def test_out_of_range_index():
    with pytest.raises(IndexError):
        Permutation(10, seed=0)[np.array([10])]
