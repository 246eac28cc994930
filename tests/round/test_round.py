"""The one private round: sampling, clipping, noise (fedsim.round)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedsim.round import (
    NoiseSource,
    PartialSum,
    clip_update,
    flatten,
    make_rng,
    noise_share_std,
    private_mean,
    sample_cohort,
    unflatten,
)


def test_poisson_inclusion_frequencies_chi_square():
    ids = np.arange(50)
    q, trials = 0.2, 4000
    counts = np.zeros(ids.size)
    for t in range(trials):
        counts[sample_cohort(ids, "poisson", make_rng(7, t, 1), sampling_rate=q)] += 1
    # each client is included Binomial(trials, q) times; chi-square on (included, excluded) per client
    expected_in, expected_out = trials * q, trials * (1 - q)
    chi2 = np.sum((counts - expected_in) ** 2 / expected_in + (counts - expected_in) ** 2 / expected_out)
    p = stats.chi2.sf(chi2, df=ids.size)
    assert p > 1e-3, (chi2, p)
    # cohort sizes are Binomial(50, q): mean 10
    sizes = [sample_cohort(ids, "poisson", make_rng(8, t, 1), sampling_rate=q).size for t in range(2000)]
    assert abs(np.mean(sizes) - ids.size * q) < 0.3
    assert min(sizes) < 6 and max(sizes) > 14  # it really varies


def test_poisson_can_be_empty_and_fixed_is_exact():
    ids = np.arange(30)
    empties = sum(
        sample_cohort(ids, "poisson", make_rng(0, t, 1), sampling_rate=0.02).size == 0 for t in range(200)
    )
    assert empties > 50  # (0.98)^30 = 0.55
    for t in range(100):
        c = sample_cohort(ids, "fixed", make_rng(0, t, 1), clients_per_round=7)
        assert c.size == 7 and np.unique(c).size == 7 and set(c) <= set(ids)
    assert np.array_equal(sample_cohort(ids, "all", make_rng(0, 0, 1)), ids)


def test_sampling_uses_its_own_generator_not_the_global_one():
    ids = np.arange(100)
    a = sample_cohort(ids, "poisson", make_rng(3, 5, 1), sampling_rate=0.3)
    np.random.seed(123)
    _ = np.random.random(1000)
    b = sample_cohort(ids[::-1], "poisson", make_rng(3, 5, 1), sampling_rate=0.3)  # order-independent too
    assert np.array_equal(a, b)


def test_sampling_errors_name_the_value():
    with pytest.raises(ValueError, match=r"sampling_rate=1.5 is invalid: must be in \(0, 1\]"):
        sample_cohort(np.arange(5), "poisson", make_rng(0, 0, 1), sampling_rate=1.5)
    with pytest.raises(
        ValueError, match=r"clients_per_round=6 is invalid: must be an integer in \[1, population=5\]"
    ):
        sample_cohort(np.arange(5), "fixed", make_rng(0, 0, 1), clients_per_round=6)
    with pytest.raises(ValueError, match="poisson, fixed, all"):
        sample_cohort(np.arange(5), "uniform", make_rng(0, 0, 1))


@pytest.mark.parametrize("as_torch", [False, True])
def test_clip_flat_l2(as_torch):
    v = np.array([3.0, 4.0, 0.0, 12.0])  # norm 13
    x = torch.tensor(v) if as_torch else v
    clipped, norm, ok = clip_update(x, 1.0)
    assert ok and norm == pytest.approx(13.0)
    assert float(np.linalg.norm(np.asarray(clipped))) == pytest.approx(1.0)
    small, norm, ok = clip_update(x * 0.01, 1.0)
    assert np.allclose(np.asarray(small), v * 0.01)
    zero, norm, ok = clip_update(x * 0, 1.0)
    assert ok and norm == 0.0 and not np.any(np.asarray(zero))


def test_non_finite_update_is_rejected_and_counted():
    p = PartialSum(3)
    p.add(np.array([1.0, 0.0, 0.0]), clip=1.0)
    assert math.isnan(p.add(np.array([np.nan, 0.0, 0.0]), clip=1.0))
    assert math.isnan(p.add(np.array([np.inf, 0.0, 0.0]), clip=1.0))
    assert math.isnan(p.add(np.array([1.0, 0.0]), clip=1.0))  # wrong shape
    assert p.count == 1 and p.rejected == 3
    assert np.array_equal(p.total, [1.0, 0.0, 0.0])


def test_partial_sums_merge_to_the_whole():
    rng = np.random.default_rng(0)
    ups = rng.normal(size=(10, 5)) * 3
    whole = PartialSum(5)
    for u in ups:
        whole.add(u, 1.0)
    a, b = PartialSum(5), PartialSum(5)
    for u in ups[:4]:
        a.add(u, 1.0)
    for u in ups[4:]:
        b.add(u, 1.0)
    a.merge(b)
    assert np.allclose(a.total, whole.total) and a.count == whole.count == 10


def _mech(population: int, z: float, clip: float, placement: str = "central", **cohort):
    from fedsim.privacy import Mechanism

    return Mechanism(
        population=population, clip=clip, noise_multiplier=z, noise_placement=placement, **cohort
    )


def test_noise_std_measured_over_many_draws():
    dim, z, clip, m = 200_000, 1.3, 0.7, 10.0
    p = PartialSum(dim)
    mean, std = private_mean(p, _mech(100, z, clip, clients_per_round=10), NoiseSource(1), 1)
    assert std == pytest.approx(z * clip)
    # noise on the mean is N(0, (z*clip/m)^2); with 2e5 draws the sample std is within 1%
    assert np.std(mean) == pytest.approx(z * clip / m, rel=0.01)
    assert abs(np.mean(mean)) < 5 * z * clip / m / math.sqrt(dim)


def test_divides_by_expected_not_realised_cohort():
    p = PartialSum(2)
    p.add(np.array([1.0, 0.0]), 1.0)
    p.add(np.array([1.0, 0.0]), 1.0)
    # the least noise multiplier there is (fedsim.validation.NOISE_MULTIPLIER_RANGE): the noise is about 1e-7
    mean, _ = private_mean(p, _mech(100, 1e-6, 1.0, clients_per_round=8), NoiseSource(0), 0)
    assert mean[0] == pytest.approx(2.0 / 8.0, abs=1e-5)


def test_distributed_noise_totals_the_central_noise_and_tops_up_missing_shares():
    dim, z, clip, n = 100_000, 1.0, 1.0, 4
    mech = _mech(100, z, clip, "distributed", clients_per_round=n)
    share = noise_share_std(mech)
    assert share**2 * n == pytest.approx((z * clip) ** 2)
    rng = np.random.default_rng(0)
    full = PartialSum(dim)
    for _ in range(n):
        full.add(rng.normal(0, share, dim), clip, already_clipped_and_noised=True)
    _, server_std = private_mean(full, mech, NoiseSource(0), 0)
    assert server_std == 0.0
    assert np.std(full.total) == pytest.approx(z * clip, rel=0.02)
    half = PartialSum(dim)
    for _ in range(n // 2):
        half.add(rng.normal(0, share, dim), clip, already_clipped_and_noised=True)
    mean, server_std = private_mean(half, mech, NoiseSource(0), 0)
    assert server_std == pytest.approx(z * clip * math.sqrt(0.5))
    assert np.std(mean * n) == pytest.approx(z * clip, rel=0.02)


def test_flatten_roundtrip():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.float32)]
    back = unflatten(flatten(arrays), arrays)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(arrays, back, strict=True))
    with pytest.raises(ValueError):
        unflatten(np.zeros(5), arrays)


def test_flower_node_ids_beyond_int64_are_sampled():
    big = [2**64 - 5, 2**63 + 7, 12, 2**63 + 1]
    cohort = sample_cohort(big, "fixed", make_rng(0, 1, 1), clients_per_round=2)
    assert cohort.size == 2 and {int(c) for c in cohort} <= set(big)
    assert [int(c) for c in sample_cohort(big, "all", make_rng(0, 1, 1))] == sorted(big)


@pytest.mark.parametrize("as_torch", [False, True])
def test_add_batch_equals_adding_row_by_row(as_torch):
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(70, 9)) * rng.choice([0.1, 1.0, 5.0], size=(70, 1))
    rows[3] = 0.0  # zero norm is fine
    rows[10, 2] = np.nan  # rejected
    rows[11, 0] = np.inf  # rejected
    weights = rng.uniform(0.5, 2.0, size=70)
    one = PartialSum(9)
    norms_one = [one.add(r, 1.0, weight=float(w)) for r, w in zip(rows, weights, strict=True)]
    batch = PartialSum(9)
    arg = torch.as_tensor(rows, dtype=torch.float32) if as_torch else rows.astype(np.float32)
    ref = PartialSum(9)  # the float32 rows, as a worker holds them
    norms_ref = [
        ref.add(r, 1.0, weight=float(w))
        for r, w in zip(np.asarray(arg, dtype=np.float64), weights, strict=True)
    ]
    norms = batch.add_batch(arg, 1.0, weights, block=16)  # several blocks
    np.testing.assert_allclose(batch.total, ref.total, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(batch.total, one.total, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(norms, norms_ref, rtol=1e-12, equal_nan=True)
    assert np.isnan(norms[10]) and np.isnan(norms[11]) and np.isnan(norms_one[10])
    assert (
        (batch.count, batch.rejected, batch.unclipped)
        == (ref.count, ref.rejected, ref.unclipped)
        == (68, 2, ref.unclipped)
    )
    assert batch.unclipped == sum(1 for n in norms_one if n <= 1.0)
    np.testing.assert_allclose(batch.norms, ref.norms, rtol=1e-12)


def test_add_batch_rejects_wrong_shapes():
    p = PartialSum(4)
    assert np.isnan(p.add_batch(np.zeros((3, 5)), 1.0)).all()
    assert p.rejected == 3 and p.count == 0 and not p.total.any()
    with pytest.raises(ValueError, match=r"\[K, dim\]"):
        p.add_batch(np.zeros(4), 1.0)  # one flat update is not a batch


def test_sampler_and_noise_source_state_round_trips_and_continues_the_same_draws():
    from fedsim.privacy import Mechanism
    from fedsim.round import NoiseSource, make_sampler

    m = Mechanism(population=50, sampling="fixed", clients_per_round=5)
    sampler, noise = make_sampler("fixed", 7), NoiseSource(7)
    restored_sampler, restored_noise = make_sampler("fixed", None), NoiseSource(None)
    restored_sampler.load_state_dict(sampler.state_dict())
    restored_noise.load_state_dict(noise.state_dict())
    for t in (1, 2, 9):
        assert np.array_equal(sampler.sample(t, range(50), m), restored_sampler.sample(t, range(50), m))
        assert np.array_equal(noise.noise(t, "model", 4, 1.0), restored_noise.noise(t, "model", 4, 1.0))
    # a checkpoint written before the source was renamed 'independent' still loads
    restored_noise.load_state_dict({"name": "gaussian", "seed": 7})
    assert restored_noise.seed == 7
    with pytest.raises(ValueError, match="cannot be loaded"):
        make_sampler("poisson", 0).load_state_dict(sampler.state_dict())
    with pytest.raises(ValueError, match="same population"):
        sampler.sample(1, range(40), m)  # sampling and accounting must use the same population


def test_add_rows_is_add_one_row_at_a_time():
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 1, (7, 5)) * np.array([[0.1], [3], [1], [0.5], [9], [2], [0.2]])
    rows[3, 2] = np.nan  # rejected whole, as add rejects it
    one, batch = PartialSum(5), PartialSum(5)
    norms = [one.add(r, 1.5) for r in rows]
    np.testing.assert_allclose(batch.add_rows(rows, 1.5), norms, rtol=1e-15)
    np.testing.assert_allclose(batch.total, one.total, rtol=1e-12)
    assert (batch.count, batch.unclipped, batch.rejected, batch.failures) == (
        one.count,
        one.unclipped,
        one.rejected,
        one.failures,
    )
    np.testing.assert_allclose(batch.norms, one.norms, rtol=1e-15)
