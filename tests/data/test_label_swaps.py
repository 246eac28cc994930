"""Concept shift between domains: ``domain_label_swaps`` exchanges pairs of labels in domains 1, 2, ..."""

import numpy as np
import pytest

from fedsim.data import build_federated_data
from fedsim.data.federated import label_maps


def test_label_maps_swap_disjoint_pairs_per_domain():
    maps = label_maps(seed=3, num_domains=4, num_classes=10, swaps=3)
    assert maps.shape == (4, 10)
    np.testing.assert_array_equal(maps[0], np.arange(10))  # domain 0 keeps its labels
    for d in range(1, 4):
        m = maps[d]
        np.testing.assert_array_equal(m[m], np.arange(10))  # a product of swaps is an involution
        assert int((m != np.arange(10)).sum()) == 6  # 3 disjoint pairs moved
    assert not np.array_equal(maps[1], maps[2])  # drawn per domain
    np.testing.assert_array_equal(maps, label_maps(3, 4, 10, 3))  # a function of the seed
    with pytest.raises(ValueError, match="domain_label_swaps"):
        label_maps(0, 2, 10, 6)


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_clients_of_later_domains_see_swapped_labels_of_the_same_inputs(dataset):
    kw = (
        {"synthetic_iid": True, "synthetic_max_samples": 60}
        if dataset == "synthetic"
        else {"domain_shift": 0.0}
    )
    plain = build_federated_data(
        dataset, num_clients=60, heldout_fraction=0.0, domains=[0.5, 0.5], seed=1, **kw
    )
    swapped = build_federated_data(
        dataset, num_clients=60, heldout_fraction=0.0, domains=[0.5, 0.5], seed=1, domain_label_swaps=2, **kw
    )
    maps = swapped._label_maps
    for cid in (0, 29, 30, 59):
        (x0, y0), (x1, y1) = plain.client_data(cid), swapped.client_data(cid)
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y1, maps[swapped.domain(cid)][y0])
    assert swapped.describe()["domain_label_swaps"] == 2
    changed = sum(int((swapped.client_data(c)[1] != plain.client_data(c)[1]).sum()) for c in range(30, 60))
    unchanged = sum(int((swapped.client_data(c)[1] != plain.client_data(c)[1]).sum()) for c in range(30))
    assert changed > 0 and unchanged == 0
    with pytest.raises(ValueError, match="domain_label_swaps"):
        build_federated_data(
            dataset, num_clients=60, heldout_fraction=0.0, domains=2, domain_label_swaps=-1, **kw
        )
