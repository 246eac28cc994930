"""The non-private baselines of a comparison: ``noise_multiplier = 0`` (clipped, un-noised DP-FedAvg) and ``clip = 0``
(plain FedAvg, which needs ``noise_multiplier = 0``). Nothing is noised, so no (epsilon, delta) holds: every accountant
reports epsilon = infinity, and every output says "not private"."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsim.cli import main
from fedsim.engine.runner import run_scenario
from fedsim.privacy import Ledger, Mechanism
from fedsim.privacy.accountants import ACCOUNTANTS, compute_curve
from fedsim.report.rows import format_row
from fedsim.round import PartialSum
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.strategies import DPFedAvg
from fedsim.validation import PrivacyInputError

FAST = ["engine.name=local", "rounds=2"]


def test_every_accountant_reports_infinity_for_an_unnoised_release():
    for kw in ({"clip": 1.0, "noise_multiplier": 0.0}, {"clip": 0.0, "noise_multiplier": 0.0}):
        m = Mechanism(population=100, sampling="poisson", sampling_rate=0.1, **kw)
        assert not m.private and m.noise_std == 0.0
        for method in ACCOUNTANTS:
            curve = compute_curve(m, 3, 1e-5, method)
            assert np.all(np.isinf(curve.epsilon)) and set(curve.status) == {"not private"}, method
    # one un-noised round in an otherwise private ledger makes the whole run not private, from that round on
    ledger = Ledger()
    noised = Mechanism(population=100, sampling="poisson", sampling_rate=0.1, noise_multiplier=1.0)
    ledger.record(1, noised)
    ledger.record(2, noised.replace(noise_multiplier=0.0))
    curve = ledger.epsilon_curve(1e-5)
    assert math.isfinite(curve[0]) and math.isinf(curve[1]) and math.isinf(ledger.epsilon(1e-5, "rdp"))
    # a noised release beside an un-noised one on the same cohort (adaptive clipping's count, agnostic FL's losses)
    both = Ledger()
    both.record(1, noised.replace(noise_multiplier=0.0))
    both.record(1, noised.replace(clip=1.0, noise_multiplier=5.0), name="clip-count")
    assert math.isinf(both.epsilon(1e-5)) and math.isinf(both.epsilon(1e-5, "rdp"))


def test_clip_zero_is_plain_fedavg_and_needs_no_noise():
    with pytest.raises(PrivacyInputError, match="0 means no clipping"):
        Mechanism(population=10, sampling="all", clip=0.0, noise_multiplier=1.0)
    strategy = DPFedAvg(sampling="all", clip=0.0, noise_multiplier=0.0, seed=0)
    plan = strategy.begin_round(1, range(4))
    partial = PartialSum(3)
    updates = np.array([[30.0, 0, 0], [0, 40.0, 0], [1.0, 1.0, 1.0], [0, 0, -2.0]])
    for u in updates:  # far above any clip: plain FedAvg averages them as they are
        strategy.accept_reply(plan, partial, int(plan.cohort[len(partial.norms)]), u, {})
    weights, metrics = strategy.finish_round(plan, np.zeros(3), partial)
    np.testing.assert_allclose(weights, updates.mean(axis=0))
    assert metrics["private"] is False and math.isinf(metrics["epsilon"]) and metrics["noise_std_sum"] == 0.0


def test_the_unnoised_release_separates_neighbouring_datasets_exactly():
    """What epsilon = infinity means, measured: without noise, the released mean with and without one client differ
    by that client's clipped update, every time: an observer tells the two datasets apart with certainty."""
    strategy = DPFedAvg(sampling="all", clip=1.0, noise_multiplier=0.0, seed=0)
    plan = strategy.begin_round(1, range(3))
    target = np.array([3.0, 4.0])  # norm 5, clipped to norm 1
    with_, without = PartialSum(2), PartialSum(2)
    for p, ups in ((with_, [np.ones(2) * 0.1, target]), (without, [np.ones(2) * 0.1])):
        for u in ups:
            p.add(u, plan.clip)
    a, _ = strategy._noised_mean(plan, with_)
    b, _ = strategy._noised_mean(plan, without)
    np.testing.assert_allclose((a - b) * plan.mechanism.expected_cohort, target / 5.0)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (
            ["privacy.noise_multiplier=0", "privacy.max_epsilon=5"],
            "no budget holds with noise_multiplier = 0",
        ),
        (["privacy.noise_multiplier=0", "privacy.noise_placement=distributed"], "adds no noise: use central"),
        (["privacy.clip=0"], "0 means no clipping (plain FedAvg), which needs noise_multiplier = 0"),
        (
            ["privacy.clip=0", "privacy.noise_multiplier=0", "privacy.adaptive_clip=true"],
            "adaptive_clip needs",
        ),
        (["privacy.noise_multiplier=-1"], "greater than or equal to 0"),
    ],
)
def test_combinations_that_mean_nothing_are_refused(items, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_scenario("quickstart", items)


def test_a_baseline_run_says_not_private_everywhere(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "quickstart", "--no-progress", "--out", str(out), "--set", "privacy.noise_multiplier=0",
                 *[a for x in FAST for a in ("--set", x)]]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "eps inf (not private)" in printed and "certified epsilon infinite (not private" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["private"] for r in rows] == [False, False]
    assert all(r["epsilon"] is None and r["epsilon_reason"] == "infinite" for r in rows)
    assert all(r["noise_std_sum"] == 0.0 and r["generalization"]["status"] == "no-statement" for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["private"] is False and summary["final"]["private"] is False
    # the same scenario with noise is private, and its rows say so
    noised = run_scenario(load_scenario("quickstart", FAST), write=False)
    assert all(r["private"] is True and math.isfinite(r["epsilon"]) for r in noised.rows)
    assert "not private" not in format_row(noised.rows[-1], 2)


def test_fedsim_privacy_reports_a_baseline_as_valid_json(capsys):
    args = ["privacy", "--json", "--population", "100", "--clients-per-round", "10", "--sampling", "fixed"]
    assert main([*args, "--noise-multiplier", "0", "--clip", "1", "--rounds", "3", "--delta", "1e-5"]) == 0
    report = json.loads(capsys.readouterr().out)
    for curve in report["methods"].values():
        assert curve["epsilon"] == [None, None, None] and curve["status"] == ["not private"] * 3
    assert report["audit"]["igmm"]["status"] == "not private"
