"""Distributed discrete noise end to end (issue 36): ``ddgauss`` and ``skellam`` runs whose clients quantise, noise and
reduce their updates modulo 2^bits as a secure sum needs, in fedsim's engine and through the ClientApp; the ledger
accounts the noise shares actually summed; a round below the noise floor is not released; impossible bits are
refused before any round runs."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from faulty import scenario_file

from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_experiment
from fedsim.privacy import Ledger
from fedsim.privacy.discrete import RDP_ORDERS, DDGaussRound, SkellamRound, epsilon_from_rdp
from fedsim.privacy.discrete_noise import DDGaussNoise
from fedsim.round import discrete as dd
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.validation import PrivacyInputError

SMALL = [
    "rounds=2",
    "data.num_clients=30",
    "privacy.sampling_rate=none",
    "privacy.clients_per_round=10",
    "privacy.noise_multiplier=1.0",
]


def _discrete(mechanism: str, *extra: str) -> list[str]:
    return [
        *SMALL,
        "privacy.noise_placement=distributed",
        f"privacy.mechanism.name={mechanism}",
        "privacy.accountant=rdp",
        *extra,
    ]


@pytest.mark.parametrize("mechanism, kind", [("ddgauss", DDGaussRound), ("skellam", SkellamRound)])
def test_a_discrete_run_records_its_own_releases_and_reports_the_decoding(mechanism, kind):
    result = run_scenario(load_scenario("quickstart", _discrete(mechanism)), write=False)
    releases = result.strategy.ledger.releases
    assert [type(r.mechanism) for r in releases] == [kind, kind]
    # every round is accounted with the floor's shares (min_shares 0.5 of the 10 expected), never a count of the
    # clients that replied, which would then be published through epsilon
    for r, row in zip(releases, result.rows, strict=True):
        assert r.mechanism.shares == 5.0 and row["non_private"]["received"] != 5
        # k = 4 standard deviations inside the modulus: a coordinate wraps with probability about 6e-5
        assert 0 <= row["wrapped_coordinates"] <= 1e-3 * r.mechanism.dim
        assert row["grid_step"] == pytest.approx(r.mechanism.gamma)
        assert 0 < row["non_private"]["quantisation_error_norm"] < 1.0
    direct = epsilon_from_rdp(RDP_ORDERS, sum(r.mechanism.rdp(RDP_ORDERS) for r in releases), 1e-5)[0]
    assert result.rows[-1]["epsilon"] == pytest.approx(direct, rel=1e-12)
    again = Ledger.from_dict(result.strategy.ledger.to_dict())
    assert again.epsilon(1e-5, "rdp") == pytest.approx(direct, rel=1e-12)


def test_the_decoded_sum_is_the_clipped_sum_up_to_the_noise_and_rounding():
    """Without noise (z tiny) the decoded mean is the clipped mean to within the grid: the whole pipeline, rotation,
    rounding, modular sum and decoding, keeps the signal."""
    exp = build_experiment(
        load_scenario("quickstart", _discrete("ddgauss", "privacy.noise_multiplier=0.001"))
    )
    from fedsim.engine.ray_engine import LocalEngine

    engine = LocalEngine(exp.data, exp.settings)
    plan = exp.strategy.begin_round(1, exp.train_ids)
    partial, _ = engine.train(plan, exp.initial_weights)
    encoding = plan.encoding_for(exp.initial_weights.size)
    decoded, stats = exp.strategy.noise.decode(1, partial, plan.mechanism, encoding)
    # the same clients' clipped updates, summed in float64 by central clipping
    exp2 = build_experiment(load_scenario("quickstart", [*SMALL, "privacy.noise_multiplier=0"]))
    plan2 = exp2.strategy.begin_round(1, exp2.train_ids)
    assert np.array_equal(plan2.cohort, plan.cohort) and plan2.clip == plan.clip
    partial2, _ = LocalEngine(exp2.data, exp2.settings).train(plan2, exp2.initial_weights)
    step = 1.0 / encoding["scale"]
    err = np.linalg.norm(decoded - partial2.total)
    assert stats["wrapped"] == 0  # hardly any noise: nothing near the modulus' edge
    # each coordinate's rounding is off by less than a grid step; the noise's norm is about z c sqrt(d)
    quantisation = stats["quantisation_error_norm"]
    assert 0 < quantisation <= step * math.sqrt(plan.cohort.size * encoding["dim"])
    assert err <= quantisation + 3 * plan.mechanism.noise_std * math.sqrt(encoding["dim"])


def test_every_engine_sends_the_same_integers():
    """Simulation equals deployment arithmetic: the same seeded run in process, on Ray workers (vectorised chunks
    encoded row by row) and through Flower's Simulation Engine (each client a ClientApp that encodes its own update)
    releases the same models from the same integers."""
    runs = {
        engine: run_scenario(
            load_scenario(
                "quickstart",
                _discrete("ddgauss", "data.num_clients=12", f"engine.name={engine}", "engine.num_workers=2"),
            ),
            write=False,
        )
        for engine in ("local", "ray", "flower")
    }
    local = runs["local"]
    for engine in ("ray", "flower"):
        assert [r.mechanism for r in runs[engine].strategy.ledger.releases] == [
            r.mechanism for r in local.strategy.ledger.releases
        ]
        np.testing.assert_array_equal(runs[engine].weights, local.weights)
    assert [r["wrapped_coordinates"] for r in runs["ray"].rows] == [
        r["wrapped_coordinates"] for r in local.rows
    ]
    assert (
        runs["flower"].rows[-1]["wrapped_coordinates"] == -1
    )  # a secure sum cannot tell; the simulation can


def _faulty(tmp_path, faults: dict, mechanism: str, name: str, extra: str = "") -> object:
    path = scenario_file(tmp_path, faults=faults, name=name)
    path.write_text(
        path.read_text().replace(
            "noise_multiplier = 0.8",
            'noise_multiplier = 0.8\nnoise_placement = "distributed"\naccountant = "rdp"\n'
            f'[privacy.mechanism]\nname = "{mechanism}"\n{extra}',
        )
    )
    return run_scenario(load_scenario(str(path)), write=False)


def test_dropouts_are_accounted_at_the_floor_whoever_drops_out(tmp_path):
    """A client that never reports leaves its share out, and the server cannot add it back: every round is accounted
    with the fewest shares a released round holds (the floor), so the ledger of a run with a dropout every round is
    the clean run's, and both spend more than all 8 shares would."""
    faulty = _faulty(tmp_path, {2: "raise"}, "ddgauss", "faulty")
    clean = _faulty(tmp_path, {}, "ddgauss", "clean")
    assert [r["non_private"]["received"] for r in faulty.rows] == [7, 7]
    assert faulty.strategy.ledger.to_dict() == clean.strategy.ledger.to_dict()
    release = faulty.strategy.ledger.releases[0].mechanism
    assert release.shares == 4.0  # min_shares 0.5 of the 8 sampled (everyone)
    every_share = dataclasses.replace(release, shares=8.0)
    assert release.epsilon(1e-5) > 1.5 * every_share.epsilon(1e-5)


def test_a_round_below_the_noise_floor_is_not_released(tmp_path):
    result = _faulty(
        tmp_path, {0: "raise", 1: "raise", 2: "raise"}, "skellam", "floor", "min_shares = 0.75\n"
    )
    assert result.stopped_by == "noise_floor" and result.rows == []
    assert (
        "fewer noise shares arrived than mechanism 'skellam''s floor min_shares=0.75" in result.stopped_reason
    )
    assert "5 of the 8" not in result.stopped_reason  # the count is a fact about clients: only in the detail
    assert result.stopped_detail.endswith("5 of the 8 sampled clients' shares arrived")
    assert len(result.strategy.ledger) == 0  # nothing released, nothing accounted


def test_bits_that_cannot_hold_the_cohort_are_refused_before_a_round_naming_the_bits_needed():
    with pytest.raises(PrivacyInputError, match=r"bits=3 is invalid: cannot hold .* use bits >= 4, fewer"):
        build_experiment(load_scenario("quickstart", _discrete("ddgauss", "privacy.mechanism.bits=3")))
    assert dd.bits_needed(10, 4.0) == 4 and dd.bits_needed(1000, 4.0) == 10


def test_target_epsilon_calibrates_the_discrete_noise():
    exp = build_experiment(
        load_scenario(
            "quickstart",
            [o for o in _discrete("ddgauss", "privacy.target_epsilon=5") if "noise_multiplier" not in o],
        )
    )
    noise = exp.strategy.noise
    assert isinstance(noise, DDGaussNoise)
    mech = exp.strategy.mechanism(exp.train_ids.size)
    eps = noise.epsilon_after(mech, 2, 1e-5)
    assert eps <= 5.0 and eps > 4.9  # met, and not by much more noise than needed


def test_fedsim_privacy_prints_the_bits_table_and_converges_to_the_gaussian_at_the_same_bound(capsys):
    import json

    from fedsim.report.privacy import main

    args = [
        "--population",
        "100000",
        "--clients-per-round",
        "1000",
        "--noise-multiplier",
        "1.0",
        "--rounds",
        "50",
    ]
    assert main(["--mechanism", "ddgauss", "--bits", "16", *args]) == 2  # the model's size is needed
    assert "--model-size: None is invalid: is required for mechanism='ddgauss'" in capsys.readouterr().err
    assert main(["--mechanism", "ddgauss", "--model-size", "10", "--methods", "pld", *args]) == 2
    assert (
        "--methods: 'pld' is invalid: cannot account mechanism='ddgauss'; allowed: rdp"
        in capsys.readouterr().err
    )
    assert main(["--mechanism", "ddgauss", "--bits", "16", "--model-size", "100000", "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    table = {row["bits"]: row for row in doc["bits_table"]}
    assert "refused" in table[8] and "use bits >= 10" in table[8]["refused"]  # 1,000 clients need 10 bits
    # quantisation costs less as bits grow, and at 20 bits nothing beyond the generic amplification bound
    eps = [table[b]["epsilon"] for b in range(12, 21)]
    assert all(a >= b for a, b in itertools.pairwise(eps))
    assert table[20]["epsilon"] == pytest.approx(table[20]["gaussian_same_bound"], rel=0.01)
    assert table[12]["epsilon"] > 1.2 * table[20]["epsilon"]
    assert table[20]["gaussian_same_bound"] >= table[20]["gaussian_epsilon"]  # the exact analysis is tighter
    assert doc["per_round"]["epsilon"][-1] == pytest.approx(table[16]["epsilon"], rel=1e-12)
    assert doc["accountant"] == "rdp" and doc["mechanism"]["padded_dim"] == 131072


def test_an_os_entropy_run_draws_its_rotation_from_the_operating_system():
    result = run_scenario(
        load_scenario("quickstart", _discrete("skellam", "rounds=1", "privacy.randomness=os-entropy")),
        write=False,
    )
    assert result.rows[0]["randomness"] == "os-entropy" and len(result.strategy.ledger) == 1
    noise = result.strategy.noise
    assert noise.seed is None
    seeds = {noise.public_randomness(1)["rotation_seed"] for _ in range(3)}
    assert len(seeds) == 3  # the same round draws anew: the operating system, not a function of (seed, round)
    seeded = build_experiment(load_scenario("quickstart", _discrete("skellam"))).strategy.noise
    assert seeded.public_randomness(1) == seeded.public_randomness(1) != seeded.public_randomness(2)


def test_max_epsilon_stops_a_discrete_run_before_the_round_that_would_exceed_it():
    full = run_scenario(load_scenario("quickstart", _discrete("ddgauss", "rounds=3")), write=False)
    eps = [row["epsilon"] for row in full.rows]
    budget = (eps[1] + eps[2]) / 2
    stopped = run_scenario(
        load_scenario("quickstart", _discrete("ddgauss", "rounds=3", f"privacy.max_epsilon={budget}")),
        write=False,
    )
    assert stopped.stopped_by == "budget" and [row["epsilon"] for row in stopped.rows] == eps[:2]


def test_fixed_size_sampling_is_refused_its_neighbours_are_not_what_the_bound_holds_for():
    with pytest.raises(
        ScenarioError, match=r"sampling='fixed' is invalid: is accounted under 'replace-one' neighbours"
    ):
        load_scenario("quickstart", _discrete("ddgauss", "privacy.sampling=fixed"))


def test_extreme_options_are_refused_with_their_names_never_a_hang():
    """Found while reviewing: a k_stddevs of 1e300 made the bits-needed search overflow, and inf made it loop."""
    for bad, match in (
        ("privacy.mechanism.bits=true", "bits must be an integer in \\[1, 32\\], got True"),
        ("privacy.mechanism.k_stddevs=inf", "k_stddevs must be finite and > 0"),
    ):
        with pytest.raises(ScenarioError, match=match):
            load_scenario("quickstart", _discrete("ddgauss", bad))
    with pytest.raises(PrivacyInputError, match="no modulus up to 32 bits does"):
        build_experiment(
            load_scenario("quickstart", _discrete("ddgauss", "privacy.mechanism.k_stddevs=1e300"))
        )
