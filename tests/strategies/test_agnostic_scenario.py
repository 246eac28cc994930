"""The shipped ``agnostic`` scenario: equal-epsilon calibration against DP-FedAvg, and lambda's direction."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.experiment import build_data, build_strategy
from fedsim.round import PartialSum
from fedsim.scenarios import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_agnostic", ROOT / "benchmarks" / "agnostic.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scenario_composes_to_unit_noise():
    sc = load_scenario("agnostic")
    assert sc.agnostic.enabled
    z = _bench().composed_z(sc.privacy.noise_multiplier, sc.agnostic.loss_noise_multiplier)
    assert z == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("rounds", [1, 7])
def test_afl_and_dp_fedavg_certify_the_same_epsilon(rounds):
    bench = _bench()
    afl_sc, avg_sc = bench.scenarios(
        str(ROOT / "scenarios" / "agnostic-domains.toml"), [], seed=0, target_z=None
    )
    data = build_data(afl_sc)  # Synthetic clients: generated on demand, so this costs nothing
    population = int(np.asarray(data.train_clients).size)

    class _Data:  # only what build_strategy reads
        num_domains = data.num_domains
        num_classes = data.num_classes
        domain = staticmethod(data.domain)
        domain_clients = staticmethod(data.domain_clients)

    afl, avg = build_strategy(afl_sc, population, _Data()), build_strategy(avg_sc, population, _Data())
    assert type(afl).__name__ == "DPAgnosticFedAvg" and type(avg).__name__ == "DPFedAvg"
    assert avg.noise_multiplier < afl.noise_multiplier
    ids = np.asarray(data.train_clients)
    for t in range(1, rounds + 1):
        for s in (afl, avg):
            s.finish_round(s.begin_round(t, ids), np.zeros(3), PartialSum(3))
    assert len(afl.ledger) == 2 * rounds and len(avg.ledger) == rounds
    assert afl.epsilon() == pytest.approx(avg.epsilon(), rel=1e-6)
    assert math.isfinite(afl.epsilon()) and afl.epsilon() > 0


def test_lambda_ascends_on_the_released_domain_losses_of_the_real_scenario():
    # Near-exact loss release (z_loss=0.05; rdp: a PLD of so small a noise is needlessly expensive) and a
    # large step, so every round's move is visible. With the scenario's own z_loss=3 the domain-2 estimate
    # has std 3 / 40 ~ 0.08 per round.
    sc = load_scenario(
        "agnostic",
        [
            "rounds=5",
            "engine.name=local",
            "engine.eval_every=1000",
            "agnostic.lambda_lr=0.5",
            "agnostic.loss_noise_multiplier=0.05",
            "privacy.accountant=rdp",
        ],
    )
    res = run_scenario(sc, write=False)
    hist = res.strategy.history
    np.testing.assert_allclose(hist[0]["lambda_used"], [0.7, 0.2, 0.1], atol=0.01)  # FedAvg's mixture
    for h in hist:
        used, nxt, loss = (np.asarray(h[k]) for k in ("lambda_used", "lambda_next", "domain_loss_noised"))
        assert nxt.sum() == pytest.approx(1.0) and nxt.min() >= 0
        # sums of losses in [0, 1] over the *expected* count q * N_d: the Poisson count moves them past 1
        assert np.all(loss > 0) and np.all(loss < 2.0)
        # projected ascent: the worst reported domain gains the most, the best reported one the least
        step = nxt - used
        assert step[np.argmax(loss)] == pytest.approx(step.max()) and step[np.argmin(loss)] == pytest.approx(
            step.min()
        )
        np.testing.assert_allclose(np.asarray(h["lambda_used"]), used)
    diag = res.rows[-1]["non_private"]
    assert diag["worst_domain_train_loss"] == max(d["loss"] for d in diag["domains_train"])
