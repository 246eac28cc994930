"""Participation schedules and correlated noise, tested on the guarantee: what changes between neighbouring runs (one
client's updates there or not) against what the ledger accounts, the released noise against the mechanism's
covariance, epsilon against dp-accounting on the equivalent Gaussian, and the refusals of combinations whose
accounting does not hold."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedsim.privacy import Ledger, PrivacyInputError, ScheduledGaussian
from fedsim.round import NoiseSource, PartialSum, make_noise_source, make_sampler
from fedsim.round.matrix_factorization import brute_force_sensitivity, toeplitz
from fedsim.strategies import AdaptiveClipping, DPFedAvg

DIM = 3


def _pld(event, delta=1e-5):
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


def _rdp(event, delta=1e-5):
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


def _run(strategy, clients, rounds, update_of, dim=DIM):
    """Drive the strategy's own round loop (begin_round, the clipped partial sum, finish_round) with updates from
    ``update_of(client, round)``; returns the released noised sums per round (times the denominator) and the
    cohorts."""
    released, cohorts = [], []
    weights = np.zeros(dim)
    for t in range(1, rounds + 1):
        plan = strategy.begin_round(t, clients)
        partial = PartialSum(dim)
        for c in plan.cohort:
            partial.add(update_of(int(c), t), plan.clip)
        new, _ = strategy.finish_round(plan, weights, partial)
        released.append((new - weights) * plan.mechanism.expected_cohort)  # server sgd lr 1: the noised sum
        weights = new
        cohorts.append(plan.cohort.copy())
    return np.array(released), cohorts


# --------------------------------------------------------------------------- samplers
def test_cyclic_groups_take_turns_and_each_client_is_placed_alone():
    s = DPFedAvg(sampling="cyclic", min_separation=4, noise_multiplier=1.0, seed=3)
    clients = list(range(200))
    seen = {}
    for t in range(1, 13):
        plan = s.begin_round(t, clients)
        for c in plan.cohort:
            assert t - seen.get(int(c), -100) == 4 or int(c) not in seen
            seen[int(c)] = t
        s.finish_round(plan, np.zeros(1), PartialSum(1))
    assert len(seen) == 200  # every client in exactly one group, every group once in 4 rounds
    # a client's group does not depend on who else is there (what the add/remove accounting needs)
    other = make_sampler("cyclic", 3)
    m = s.mechanism(150)
    other.sample(1, list(range(150)), m)
    assert all(other.groups[c] == s.sampler.groups[c] for c in range(150))


def test_cyclic_refuses_other_clients_and_min_separation_enforces_gaps_and_caps():
    s = DPFedAvg(sampling="cyclic", min_separation=3, noise_multiplier=1.0, seed=0)
    plan = s.begin_round(1, range(30))
    s.finish_round(plan, np.zeros(1), PartialSum(1))
    with pytest.raises(PrivacyInputError, match="same clients every round"):
        s.begin_round(2, range(31))

    m = DPFedAvg(sampling="min-separation", min_separation=3, max_participations=2, sampling_rate=0.9, seed=1)
    history: dict[int, list[int]] = {}
    for t in range(1, 16):
        plan = m.begin_round(t, range(40))
        for c in plan.cohort:
            history.setdefault(int(c), []).append(t)
        m.finish_round(plan, np.zeros(1), PartialSum(1))
    assert history and all(len(r) <= 2 for r in history.values())
    assert all(b - a >= 3 for r in history.values() for a, b in itertools.pairwise(r))
    assert any(len(r) == 2 for r in history.values())


def test_a_sampler_that_breaks_the_schedule_is_caught():
    sampler = make_sampler("min-separation", 0)

    def cheat(ids, round_, m):  # everyone, every round
        return ids

    sampler.draw_scheduled = cheat
    s = DPFedAvg(sampling=sampler, min_separation=2, sampling_rate=0.5, seed=0)
    plan = s.begin_round(1, range(5))
    s.finish_round(plan, np.zeros(1), PartialSum(1))
    with pytest.raises(PrivacyInputError, match="against the schedule"):
        s.begin_round(2, range(5))


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("mechanism", ["banded-mf", "blt"])
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_correlated_noise_without_a_schedule_is_refused(mechanism, sampling):
    kw = {"sampling_rate": 0.1} if sampling == "poisson" else {"clients_per_round": 5}
    with pytest.raises(PrivacyInputError, match=r"cyclic.*min-separation"):
        DPFedAvg(sampling=sampling, noise=mechanism, seed=0, rounds=10, **kw)


def test_schedules_refuse_what_their_accounting_does_not_cover():
    with pytest.raises(PrivacyInputError, match="noise_placement"):
        DPFedAvg(sampling="cyclic", min_separation=2, noise_placement="distributed", seed=0)
    with pytest.raises(PrivacyInputError, match="adaptive_clip"):
        DPFedAvg(sampling="cyclic", min_separation=2, adaptive_clipping=AdaptiveClipping(), seed=0)
    with pytest.raises(PrivacyInputError, match="min_separation"):
        DPFedAvg(sampling="cyclic", seed=0)
    with pytest.raises(PrivacyInputError, match="min_separation"):
        DPFedAvg(sampling="poisson", sampling_rate=0.1, min_separation=3, seed=0)
    with pytest.raises(PrivacyInputError, match="clients_per_round"):
        DPFedAvg(sampling="cyclic", min_separation=2, clients_per_round=4, seed=0)
    with pytest.raises(PrivacyInputError, match="bands"):
        make_noise_source("blt", 0, bands=3)


# --------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("bands", [None, 1])
def test_cyclic_independent_and_one_band_are_the_gaussian_of_the_participations(bands):
    """A cyclic schedule with whole groups: T rounds, b groups, z: exactly the Gaussian mechanism with noise
    multiplier z / sqrt(ceil(T / b)); banded-mf with one band is the same mechanism, and releases the same noise."""
    z, b, T = 1.3, 4, 10
    runs = {}
    for noise in ("independent", "banded-mf"):
        opts = {"noise": make_noise_source(noise, 5, bands=bands)} if noise == "banded-mf" else {}
        if noise == "banded-mf" and bands is None:
            opts = {"noise": make_noise_source("banded-mf", 5, coefficients=[1.0])}
        s = DPFedAvg(sampling="cyclic", min_separation=b, noise_multiplier=z, seed=5, rounds=T, **opts)
        released, _ = _run(s, range(40), T, lambda c, t: np.full(DIM, 0.1))
        runs[noise] = (released, s.ledger)
    want_pld = _pld(dp_event.GaussianDpEvent(z / math.sqrt(math.ceil(T / b))))
    for _released, ledger in runs.values():
        assert ledger.epsilon(1e-5, "pld") == pytest.approx(want_pld, rel=1e-3)
        assert ledger.epsilon(1e-5, "rdp") == pytest.approx(
            _rdp(dp_event.GaussianDpEvent(z / math.sqrt(math.ceil(T / b)))), rel=1e-9
        )
    np.testing.assert_array_equal(runs["independent"][0], runs["banded-mf"][0])


def test_amplified_cyclic_is_k_poisson_sampled_gaussians():
    """Cyclic groups with Poisson sampling within them (the amplified setting of Choquette-Choo et al. 2023):
    independent noise and banded-mf with at most b bands are ceil(T / b) Poisson-sampled Gaussians of the column
    norm; BLT (dense columns) claims no amplification."""
    z, b, T, q = 0.9, 5, 12, 0.3
    k = math.ceil(T / b)
    s = DPFedAvg(sampling="cyclic", min_separation=b, sampling_rate=q, noise_multiplier=z, seed=0, rounds=T)
    _run(s, range(50), T, lambda c, t: np.zeros(DIM))
    want = _pld(
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), k)
    )
    assert s.ledger.epsilon(1e-5) == pytest.approx(want, rel=2e-3)
    assert s.accounting.amplified

    def amplified(noise):
        return DPFedAvg(
            sampling="cyclic",
            min_separation=b,
            sampling_rate=q,
            noise_multiplier=z,
            seed=0,
            rounds=T,
            noise=noise,
        )

    banded = amplified("banded-mf")
    _run(banded, range(50), T, lambda c, t: np.zeros(DIM))
    col = float(np.sum(np.square(banded.noise.coefficients)))
    want = _pld(
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z / math.sqrt(col))), k
        )
    )
    assert banded.accounting.amplified and banded.ledger.epsilon(1e-5) == pytest.approx(want, rel=2e-3)

    blt = amplified("blt")
    assert not blt.accounting.amplified


@pytest.mark.parametrize(
    ("sampling", "b", "k"), [("cyclic", 3, None), ("min-separation", 2, 3), ("all", 1, None)]
)
def test_neighbouring_runs_differ_by_at_most_the_accounted_sensitivity(sampling, b, k):
    """The guarantee, measured: run the strategy twice with the same seed, once with client u's updates and once
    with u contributing nothing (its schedule unchanged, as u's absence leaves every other client's). The released
    sums differ by C^{-1}-correlated-noise-free amounts; whitened by C, their norm is what the Gaussian mechanism
    sees, and must be at most the ledger's sensitivity s_T (equal for the worst client); epsilon is then the
    Gaussian's of z / s_T."""
    T, z, n_clients = 9, 1.1, 12
    kw = {"min_separation": b} if sampling != "all" else {}
    if sampling == "min-separation":
        kw.update(max_participations=k, sampling_rate=1.0)
    worst = 0.0
    for u in range(n_clients):
        out = []
        for present in (True, False):
            s = DPFedAvg(sampling=sampling, noise_multiplier=z, seed=11, rounds=T, noise="banded-mf", **kw)

            def update(c, t, present=present, u=u):
                return np.full(DIM, 1.0 / math.sqrt(DIM)) if (c == u and present) else np.zeros(DIM)

            released, _ = _run(s, range(n_clients), T, update)
            out.append(released)
        c_matrix = toeplitz(np.asarray(s.noise.coefficients), T)
        moved = float(np.linalg.norm(c_matrix @ (out[0] - out[1])))  # per unit clip
        accounted = s.ledger.releases[-1].mechanism.sensitivity_squared
        assert moved**2 <= accounted * (1 + 1e-9)
        worst = max(worst, moved**2)
    # the worst client reaches it, and it is the brute-force maximum over the schedule's patterns
    assert worst == pytest.approx(accounted, rel=1e-9)
    assert math.sqrt(accounted) == pytest.approx(brute_force_sensitivity(c_matrix, b, k), rel=1e-9)
    want = _pld(dp_event.GaussianDpEvent(z / math.sqrt(accounted)))
    assert s.ledger.epsilon(1e-5) == pytest.approx(want, rel=2e-3)


def test_released_noise_has_the_mechanism_covariance():
    """Over many seeds, the noise banded-mf releases in T rounds has covariance sigma^2 C^{-1} C^{-T}."""
    T, std = 6, 2.0
    noise = make_noise_source("banded-mf", 0, coefficients=[1.0, 0.6, 0.3])
    c_inv = np.linalg.inv(toeplitz(np.asarray(noise.coefficients), T))
    draws = []
    for seed in range(4000):
        src = make_noise_source("banded-mf", seed, coefficients=[1.0, 0.6, 0.3])
        draws.append([src.noise(t, "model", 1, std)[0] for t in range(1, T + 1)])
    cov = np.cov(np.array(draws).T)
    want = std**2 * c_inv @ c_inv.T
    # standard error of a covariance entry from 4000 draws ~ sqrt((s_ii s_jj + s_ij^2)/n) < 0.1 here
    assert np.max(np.abs(cov - want)) < 0.3


def test_resumed_correlated_noise_is_the_uninterrupted_noise():
    for name, opts in (
        ("banded-mf", {"bands": 3}),
        ("blt", {"buffers": 2}),
        ("tree", {"estimator": "honaker"}),
        ("tree", {}),
    ):
        full = make_noise_source(name, 7, rounds=8, **opts)
        full.prepare(None, 3, None)
        a = [full.noise(t, "model", 4, 1.5) for t in range(1, 9)]
        first = make_noise_source(name, 7, rounds=8, **opts)
        first.prepare(None, 3, None)
        b = [first.noise(t, "model", 4, 1.5) for t in range(1, 5)]
        state = first.state_dict()
        resumed = make_noise_source(name, 7, rounds=8, **opts)
        resumed.load_state_dict(state)
        b += [resumed.noise(t, "model", 4, 1.5) for t in range(5, 9)]
        np.testing.assert_array_equal(np.array(a), np.array(b))
        with pytest.raises(ValueError, match="in order"):
            resumed.noise(3, "model", 4, 1.5)


def test_deployment_draws_correlated_noise_and_groups_from_the_operating_system():
    for name in ("banded-mf", "tree", "blt"):
        opts = {"coefficients": [1.0, 0.5]} if name == "banded-mf" else {}
        if name == "blt":
            opts = {"decays": [0.9], "output_scales": [0.2]}
        a, b = make_noise_source(name, None, **opts), make_noise_source(name, None, **opts)
        assert a.randomness == "os-entropy"
        assert not np.array_equal(a.noise(1, "model", 5, 1.0), b.noise(1, "model", 5, 1.0))
    groups = []
    for _ in range(2):
        s = DPFedAvg(sampling="cyclic", min_separation=4, seed=None)
        s.begin_round(1, range(64))
        groups.append([s.sampler.groups[c] for c in range(64)])
    assert groups[0] != groups[1]


def test_the_ledger_saves_and_loads_scheduled_rounds():
    s = DPFedAvg(
        sampling="cyclic", min_separation=2, noise_multiplier=1.0, seed=0, noise="banded-mf", rounds=6
    )
    _run(s, range(10), 6, lambda c, t: np.zeros(DIM))
    loaded = Ledger.from_dict(s.ledger.to_dict())
    assert isinstance(loaded.releases[0].mechanism, ScheduledGaussian)
    assert loaded.epsilon(1e-5) == pytest.approx(s.ledger.epsilon(1e-5))
    # a round that adds no sensitivity is a no-op event, never a negative one
    incs = [r.mechanism.increment for r in loaded.releases]
    assert min(incs) >= 0 and sum(incs) == pytest.approx(loaded.releases[-1].mechanism.sensitivity_squared)


def test_independent_noise_is_still_the_base_class():
    assert type(make_noise_source("independent", 0)) is NoiseSource


@pytest.mark.parametrize("estimator", ["standard", "honaker"])
def test_tree_noise_sums_to_the_prefix_noise_and_is_accounted_over_its_nodes(estimator):
    """Tree aggregation under a cyclic schedule: the per-round noises add up to the tree's prefix noise, and the
    ledger's epsilon is the Gaussian of z / s_T with s_T^2 the largest sum over complete nodes of a cyclic group's
    participations squared (Kairouz et al.'s accounting), checked by enumerating the groups."""
    from fedsim.round.tree import complete_nodes

    T, b, z = 11, 3, 1.2
    s = DPFedAvg(sampling="cyclic", min_separation=b, noise_multiplier=z, seed=2, rounds=T, noise="tree")
    s.noise = make_noise_source("tree", 2, estimator=estimator)
    s._accounting = None
    released, _ = _run(s, range(30), T, lambda c, t: np.zeros(DIM))
    np.testing.assert_allclose(released.sum(axis=0), s.noise._stream.prefix_noise(), rtol=1e-9, atol=1e-9)
    worst = max(
        sum(
            len({r for r in range(g, T, b)} & set(range(i * 2**d, (i + 1) * 2**d))) ** 2
            for d, i in complete_nodes(T)
        )
        for g in range(b)
    )
    assert s.ledger.releases[-1].mechanism.sensitivity_squared == pytest.approx(worst)
    assert s.ledger.epsilon(1e-5) == pytest.approx(
        _pld(dp_event.GaussianDpEvent(z / math.sqrt(worst))), rel=2e-3
    )


def test_fedsim_privacy_prints_and_calibrates_a_schedule(capsys):
    """`fedsim privacy --schedule/--mechanism`: the curve is the Gaussian of z / s_t (what a run's ledger composes)
    and --target-epsilon's noise multiplier meets the target."""
    import json

    from fedsim.report.privacy import main

    argv = [
        "--population",
        "100",
        "--schedule",
        "cyclic",
        "--min-separation",
        "5",
        "--mechanism",
        "banded-mf",
    ]
    argv += ["--rounds", "20", "--delta", "1e-6", "--json", "--methods", "pld", "rdp", "igmm"]
    assert main([*argv, "--target-epsilon", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    z = doc["calibration"]["pld"]
    assert doc["methods"]["pld"]["epsilon"][-1] <= 3.0 + 1e-9  # at the larger (rdp) multiplier
    assert "igmm" in doc["not_applicable"]
    s = DPFedAvg(
        sampling="cyclic", min_separation=5, noise_multiplier=z, seed=0, noise="banded-mf", rounds=20
    )
    _run(s, range(100), 20, lambda c, t: np.zeros(DIM))
    assert s.ledger.epsilon(1e-6) == pytest.approx(3.0, abs=0.01) and s.ledger.epsilon(1e-6) <= 3.0
    assert (
        main(
            [
                "--population",
                "100",
                "--sampling-rate",
                "0.1",
                "--mechanism",
                "blt",
                "--rounds",
                "5",
                "--noise-multiplier",
                "1",
            ]
        )
        == 2
    )
    assert "cyclic" in capsys.readouterr().err


def test_a_scenario_calibrated_to_a_target_epsilon_reaches_it():
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    for overrides in (
        [],
        [
            "privacy.mechanism=independent",
            "privacy.sampling=poisson",
            "privacy.min_separation=none",
            "privacy.clients_per_round=40",
        ],
    ):
        scenario = load_scenario("noise-mechanisms", ["rounds=10", "privacy.target_epsilon=3", *overrides])
        result = run_scenario(scenario, write=False)
        assert 2.99 <= result.rows[-1]["epsilon"] <= 3.0
        assert scenario.privacy.noise_multiplier == result.strategy.noise_multiplier != 1.0


def test_a_sweep_reuses_a_run_calibrated_to_its_target():
    from fedsim.sweep import config_differences

    plan = {"privacy": {"target_epsilon": 4.0, "noise_multiplier": 1.0}}
    assert config_differences({"privacy": {"target_epsilon": 4.0, "noise_multiplier": 5.3}}, plan) == []
    assert config_differences({"privacy": {"target_epsilon": 2.0, "noise_multiplier": 5.3}}, plan) == [
        "privacy.target_epsilon: 2.0 in the run, 4.0 planned"
    ]
    assert config_differences({"privacy": {"noise_multiplier": 5.3}}, {"privacy": {"noise_multiplier": 1.0}})


@pytest.mark.parametrize(
    ("mechanism", "sampling"), [("blt", "cyclic"), ("tree", "min-separation"), ("banded-mf", "cyclic")]
)
def test_a_strategy_resumed_from_its_checkpoint_releases_what_an_uninterrupted_one_does(
    tmp_path, mechanism, sampling
):
    """Every piece of a scheduled run's state (the cyclic groups or each client's last round, the correlated noise's
    buffers and strategy matrix, the ledger) goes through checkpoint.npz: rounds 4-8 after a resume release exactly
    what an uninterrupted run releases, and the ledger is the same."""
    from fedsim.report.checkpoint import read_checkpoint, write_checkpoint

    kw = {"min_separation": 3, "sampling_rate": 0.8 if sampling == "min-separation" else 0.5}

    def strategy():
        return DPFedAvg(sampling=sampling, noise_multiplier=2.0, seed=4, rounds=8, noise=mechanism, **kw)

    def update(c, t):
        return np.full(DIM, 0.01 * c)

    whole, _ = _run(strategy(), range(30), 8, update)
    first = strategy()
    _run(first, range(30), 3, update)
    write_checkpoint(tmp_path, 3, np.zeros(DIM), first.state_dict(), "config")
    resumed = strategy()
    resumed.load_state_dict(read_checkpoint(tmp_path, "config").strategy)
    released = []
    weights = np.zeros(DIM)
    for t in range(4, 9):
        plan = resumed.begin_round(t, range(30))
        partial = PartialSum(DIM)
        for c in plan.cohort:
            partial.add(update(int(c), t), plan.clip)
        new, _ = resumed.finish_round(plan, weights, partial)
        released.append((new - weights) * plan.mechanism.expected_cohort)
    np.testing.assert_allclose(np.array(released), whole[3:], rtol=1e-12, atol=1e-12)
    reference = strategy()
    _run(reference, range(30), 8, update)
    assert resumed.ledger.to_dict() == reference.ledger.to_dict()


# --------------------------------------------------------------------------- published settings
@pytest.mark.parametrize(("z", "published_bound", "ours"), [(1.13, 19.74, 18.7096), (8.83, 2.04, 1.7732)])
def test_kairouz_et_al_stackoverflow_tree_setting(z, published_bound, ours):
    """DP-FTRL with tree aggregation on StackOverflow (Kairouz et al. 2021; TensorFlow Privacy's
    tree_aggregation_accountant_test.py, test_compute_eps_tree_restart): one tree over 1,600 steps, each user once,
    delta 1e-6; TFP asserts epsilon < 19.74 at noise 1.13 and < 2.04 at 8.83. fedsim's schedule: 1,600 cyclic groups
    (each client once), the tree mechanism; its sensitivity^2 is the 11 complete nodes above one leaf. ``ours``: the
    same event through dp-accounting's RDP with TFP's orders (an independent computation, see the issue notes)."""
    from fedsim.privacy import ScheduleAccounting
    from fedsim.privacy.certified import quiet_absl

    noise = make_noise_source("tree", 0)
    accounting = ScheduleAccounting(noise, "cyclic", 1600, None)
    assert accounting.prefix(1600)[1] == 11.0
    with quiet_absl():
        eps = _rdp(accounting.run_event(1600, z), delta=1e-6)
    assert eps < published_bound
    assert eps == pytest.approx(
        ours, rel=0.02
    )  # dp-accounting's default RDP orders differ slightly from TFP's


def test_jax_privacy_amplified_banded_setting():
    """jax_privacy's _AmplifiedBandMFHelper test (tests/matrix_factorization/toeplitz_test.py): n = 100 steps, 100
    examples in batches of 10 over 10 bands (each example in one batch of every 10), epsilon 2 at delta 1e-6 by RDP:
    the required noise std is nm * sqrt(minsep_sensitivity_squared(coefs, min_sep=10, k=10)) with nm = 2.38257858 and
    the sensitivity^2 17.9134394 of the first 10 square-root coefficients. fedsim: a cyclic schedule of 10 whole
    groups and banded-mf with those coefficients, calibrated by fedsim privacy's calibrate_schedule."""
    from fedsim.privacy import ScheduleAccounting
    from fedsim.privacy.schedule import MARGIN, calibrate_schedule
    from fedsim.round.matrix_factorization import prefix_sum_sqrt_coefficients

    noise = make_noise_source("banded-mf", 0, coefficients=prefix_sum_sqrt_coefficients(10).tolist())
    accounting = ScheduleAccounting(noise, "cyclic", 10, None)
    assert accounting.prefix(100)[1] == pytest.approx(17.91343942, rel=1e-8)
    z = calibrate_schedule(accounting, 100, 2.0, 1e-6, "rdp")
    # aimed MARGIN below the target: a noise multiplier larger by about that much
    assert z == pytest.approx(2.38257858 * math.sqrt(17.91343942), rel=2 * MARGIN)
    assert z >= 2.38257858 * math.sqrt(17.91343942) * (1 - 1e-4)
