"""What the accountant reports, said honestly: kinds of bound, thresholds, huge epsilons, composed releases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsim.privacy import CERTIFIED, PAPER_BOUNDS, VALID_BOUNDS, Mechanism, compute_curve, method_kind
from fedsim.privacy.gaussian import amplify_epsilon
from fedsim.privacy.paper.audit import audit_closed_forms
from fedsim.report.privacy import main as privacy_main


def test_igmm_corrected_is_a_valid_bound_not_a_certified_accountant():
    assert {"pld", "rdp"} == CERTIFIED
    assert "igmm-corrected" in VALID_BOUNDS and "igmm-corrected" not in CERTIFIED
    assert method_kind("igmm-corrected") == "valid closed-form bound"
    assert method_kind("igmm") == "paper bound, not a certificate" and "igmm" in PAPER_BOUNDS
    c = compute_curve(Mechanism(population=1000, clients_per_round=100), 5, 1e-5, "igmm-corrected")
    assert not c.certified and c.to_dict()["kind"] == "valid closed-form bound"


def test_thm8_verdict_states_the_threshold_the_theorem_uses():
    m = Mechanism(population=100, sampling="fixed", clients_per_round=10, noise_multiplier=1.0)
    a = audit_closed_forms(m, 30, 1e-5)["dp-fl-thm8"]
    assert not a["defined"]
    p, et8 = 10 / 100, a["eps0"]
    threshold = p * 30 * et8  # the printed Chernoff factor needs eps' < p*T*et8
    assert a["defined_below"] == pytest.approx(threshold)
    assert f"p*T*et8={threshold:.3g}" in a["verdict"]
    assert a["et"] * 30 == pytest.approx(2 * threshold)  # what the verdict used to print: T*et, doubled


def test_amplification_is_finite_past_exp_overflow():
    assert float(amplify_epsilon(800.0, 0.01)) == pytest.approx(800.0 + math.log(0.01), rel=1e-12)
    assert float(amplify_epsilon(1.0, 0.5)) == pytest.approx(math.log1p(0.5 * math.expm1(1.0)))
    assert float(amplify_epsilon(5000.0, 1.0)) == pytest.approx(5000.0)


@pytest.mark.parametrize(
    "args",
    [
        ["--sampling", "all", "--noise-multiplier", "0.001", "--rounds", "3"],
        ["--sampling", "poisson", "--sampling-rate", "0.9", "--noise-multiplier", "0.05", "--rounds", "4"],
        ["--sampling", "fixed", "--clients-per-round", "50", "--noise-multiplier", "0.01", "--rounds", "3"],
    ],
)
def test_privacy_json_reports_epsilons_above_700_as_numbers(capsys, args):
    assert privacy_main(["--population", "100", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for method in ("pld", "rdp", "igmm-corrected", "kairouz", "basic"):
        eps = doc["methods"][method]["epsilon"][-1]
        assert isinstance(eps, float) and eps > 700, (method, eps)
    assert doc["methods"]["pld"]["notes"]  # e.g. that PLD was answered with RDP (it would not fit in memory)
    for audit in doc["audit"].values():
        assert audit["verdict"].startswith("paper bound; ")
    assert privacy_main(["--population", "100", *args]) == 0  # the table too
    assert "pld" in capsys.readouterr().out


def test_run_summary_describes_every_release_of_a_round(tmp_path):
    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    scenario = load_scenario(
        "quickstart",
        [
            "rounds=2",
            "data.num_clients=12",
            "engine.name=local",
            "privacy.adaptive_clip=true",
            "privacy.count_noise_multiplier=0.5",
        ],
    )
    res = run_scenario(scenario, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    audit = summary["paper_bounds_audit"]
    assert "model release alone" in audit["verdicts_describe"]
    assert "all of a round's releases" in audit["min_population_describes"]
    assert summary["randomness"] == "seeded" and "does NOT cover" in summary["privacy_scope"]
    assert "train_accuracy" in summary["final_non_private"] and "train_accuracy" not in summary["final"]
    # igmm-corrected uses the model and the count composed: with a noisy count (z=0.5), far above the model's
    from fedsim.privacy import epsilon_curve

    model_only = epsilon_curve(
        res.strategy.mechanism(res.strategy.ledger.releases[0].mechanism.population),
        2,
        1e-5,
        "igmm-corrected",
    )
    row = res.rows[-1]
    assert row["paper_epsilon_igmm-corrected"] > 1.5 * model_only[-1]
    assert row["epsilon"] <= row["paper_epsilon_igmm-corrected"] * (1 + 1e-9)
    assert np.isfinite(row["epsilon"])
