"""The generalization statement's minimum population for a cohort given as ``clients_per_round``: the search starts
at the smallest population that can hold the cohort (it started at 1, where a Poisson cohort of 20 is refused, and
every such run printed ``paper bounds: none for 20: must be an integer in [1, population=1]``)."""

from __future__ import annotations

import pytest

from fedsim.privacy import Mechanism
from fedsim.privacy.paper import generalization_statement, min_population
from fedsim.privacy.paper.generalization import compute_curve


def _ok(m: Mechanism, n: int, rounds: int, delta: float) -> bool:
    mech = m.at_population(n)
    eps = float(compute_curve(mech, rounds, delta, "pld").epsilon[-1])
    return generalization_statement(eps, delta, n)["status"] == "ok"


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_min_population_of_a_cohort_given_as_clients_per_round(sampling):
    m = Mechanism(population=90, sampling=sampling, clients_per_round=20, noise_multiplier=1.0)
    n = min_population(m, 20, 1e-5)
    assert n is not None and n >= 20
    assert _ok(m, n, 20, 1e-5) and not _ok(m, n - 1, 20, 1e-5)  # the smallest: one client fewer is not enough


def test_a_cohort_larger_than_any_searched_population_has_none():
    m = Mechanism(population=100, sampling="poisson", clients_per_round=50, noise_multiplier=1.0)
    assert min_population(m, 5, 1e-5, max_population=40) is None
