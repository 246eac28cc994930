"""Each seam takes a mechanism written outside fedsim (tests/seam_plugins.py) through its public registry, and a
scenario runs with it end to end, touching no fedsim file: a sampling scheme, a noise source that keeps state, and a
per-layer rule. (The engine and accountant seams have their own tests: tests/engine/test_engine_seam.py and
tests/privacy/test_accountant_seam.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import seam_plugins
from seam_plugins import RecordingNoise, ReversedPoisson

from fedsim.engine.runner import run_scenario
from fedsim.privacy import Ledger, Mechanism
from fedsim.report.checkpoint import read_checkpoint, write_checkpoint
from fedsim.scenarios import ScenarioError, load_scenario
from fedsim.strategies import DPFedAvg

SMALL = ["rounds=3", "engine.name=local", "data.num_clients=30", "privacy.sampling_rate=0.3"]


@pytest.fixture(scope="module", autouse=True)
def plugins():
    seam_plugins.register_all()


def _run(*overrides: str, out=None):
    scenario = load_scenario("quickstart", [*SMALL, *overrides])
    return run_scenario(scenario, out, write=out is not None)


def test_a_sampling_scheme_from_outside_runs_and_is_accounted_by_its_own_meaning():
    mine = _run(f"privacy.sampling={ReversedPoisson.name}")
    ref = _run("privacy.sampling=poisson")
    assert not np.array_equal(
        mine.weights, ref.weights
    )  # other cohorts (of the same sizes: the same uniforms)
    releases = mine.strategy.ledger.releases
    assert {r.mechanism.sampling for r in releases} == {ReversedPoisson.name}
    assert releases[0].mechanism.to_dp_event() == ref.strategy.ledger.releases[0].mechanism.to_dp_event()
    # the same privacy meaning as Poisson sampling: the same epsilon every round
    assert [r["epsilon"] for r in mine.rows] == [r["epsilon"] for r in ref.rows]
    # a saved ledger of the scheme loads back (the registry is read when it is validated)
    assert Ledger.from_dict(mine.strategy.ledger.to_dict()).epsilon(1e-5) == mine.rows[-1]["epsilon"]
    # the strategy takes the object as well as the name; an unknown name is refused with the registered ones
    strategy = DPFedAvg(sampling=ReversedPoisson(seed=3), sampling_rate=0.5, seed=3)
    assert strategy.begin_round(1, range(40)).cohort.size > 0
    with pytest.raises(ScenarioError, match=f"must be one of poisson, fixed, all, .*{ReversedPoisson.name}"):
        load_scenario("quickstart", ["privacy.sampling=round-robin"])


def test_a_sampler_with_its_own_privacy_meaning_is_asked_not_switched_on():
    class EveryOtherClient(ReversedPoisson):  # a scheme whose meaning differs: replace-one, its own event
        name = "toy-replace"
        neighbouring = "replace-one"

        @classmethod
        def pld_parameters(cls, m, relation):
            return (m.noise_std / m.replace_sensitivity, cls.q(m), "ADD_OR_REMOVE_ONE")

    from fedsim.round import SAMPLERS, register_sampler

    register_sampler(EveryOtherClient)
    try:
        m = Mechanism(
            population=100, sampling="toy-replace", sampling_rate=0.1, clip=1.0, noise_multiplier=2.0
        )
        assert m.neighbouring == "replace-one" and m.sensitivity == 2.0
        assert m.pld_parameters() == (1.0, 0.1, "ADD_OR_REMOVE_ONE")
        with pytest.raises(ValueError, match="registered already"):
            register_sampler(type("Again", (ReversedPoisson,), {"name": "toy-replace"}))
    finally:
        SAMPLERS.pop("toy-replace")


def test_a_noise_source_from_outside_serves_every_noise_vector_and_checkpoints_its_state(tmp_path):
    # central noise: the model noise only, and the same draws as fedsim's own source (rows bit for bit)
    ref = _run()
    mine = _run(f"privacy.mechanism={RecordingNoise.name}")
    noise = mine.strategy.noise
    assert isinstance(noise, RecordingNoise)
    assert {p for _, p, _, _ in noise.served} == {"model"}
    assert [(t, s) for t, _, _, s in noise.served] == [
        (t, 1.0) for t in (1, 2, 3)
    ]  # z * clip, from the mechanism
    assert np.array_equal(mine.weights, ref.weights)
    assert [r["epsilon"] for r in mine.rows] == [r["epsilon"] for r in ref.rows]

    # distributed noise with adaptive clipping: the clients' shares (with their count noise) and the server's
    # count noise come from it as well
    dist = _run(
        f"privacy.mechanism={RecordingNoise.name}",
        "privacy.noise_placement=distributed",
        "privacy.adaptive_clip=true",
    )
    served = {p for _, p, _, _ in dist.strategy.noise.served}
    assert served == {"model", "share", "count"}
    expected = dist.strategy.ledger.releases[0].mechanism.expected_cohort
    shares = [s for t, p, _, s in dist.strategy.noise.served if p == "share" and t == 1]  # clip 1 in round 1
    assert shares and all(s == pytest.approx(1.0 / math.sqrt(expected)) for s in shares)  # z*clip/sqrt(E)

    # agnostic FL: the per-domain loss noise too
    agn = load_scenario("agnostic-domains", ["rounds=2", f"privacy.mechanism={RecordingNoise.name}"])
    result = run_scenario(agn, write=False)
    assert {p for _, p, _, _ in result.strategy.noise.served} == {"model", "loss"}

    # its state (arrays included) goes through a checkpoint and back
    config = "x = 1\n"
    state = mine.strategy.state_dict()
    assert state["noise"]["name"] == RecordingNoise.name
    write_checkpoint(tmp_path, 3, mine.weights, state, config)
    restored = DPFedAvg(noise=RecordingNoise(None), sampling_rate=0.3)
    restored.load_state_dict(read_checkpoint(tmp_path, config).strategy)
    assert np.array_equal(restored.noise.last_model_draw, noise.last_model_draw)
    assert restored.noise.seed == noise.seed


def test_a_layer_rule_from_outside_gives_its_layer_the_per_layer_path():
    model = ["model.name=none", "model.hidden=none", "model.factory=seam_plugins:scaled_mlp"]
    fast = _run(*model, "engine.vectorize=per-layer")
    loop = _run(*model, "engine.vectorize=loop")
    assert {r["local_training"] for r in fast.rows} == {"per-layer"}
    np.testing.assert_allclose(fast.weights, loop.weights, rtol=1e-5, atol=1e-6)
    from fedsim.training import layers

    rule = layers.RULES.pop(seam_plugins.Scale)
    try:  # without the rule, per-layer is refused and names the layer
        with pytest.raises(Exception, match="Scale"):
            _run(*model, "engine.vectorize=per-layer")
    finally:
        layers.RULES[seam_plugins.Scale] = rule
