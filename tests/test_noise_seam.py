"""The noise-mechanism seam: a mechanism defined outside fedsim (tests/noise_plugin.py: Cauchy noise, which is not
Gaussian) with its own release kind and accountant runs a scenario end to end, with central and with distributed
placement, in fedsim's engine and through the ClientApp (Flower's Simulation Engine), touching no fedsim file. It is
accounted by what it declares, never as Gaussian; a mechanism that draws its own noise without declaring its release
is refused when it is registered."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.privacy import AdaptiveClipping, Ledger, Mechanism, PrivacyInputError, PrivacySettings
from fedsim.round import NOISE_SOURCES, NoiseSource, register_noise_source
from fedsim.scenarios import ScenarioError, load_scenario

Z = 40.0  # Cauchy's tails are heavy: much noise per coordinate keeps the toy's epsilon finite and the run short
SMALL = ["rounds=2", "data.num_clients=30", "privacy.sampling_rate=0.3", f"privacy.noise_multiplier={Z}"]


NAME = "toy-cauchy"


@pytest.fixture(scope="module")
def plugin():
    """The plug-in module, imported here rather than at collection (importing it registers it, as a scenario's
    ``plugins`` import does), and taken out of the registries afterwards: other tests iterate them."""
    import noise_plugin

    noise_plugin.register()
    yield noise_plugin
    noise_plugin.unregister()


@pytest.fixture(autouse=True)
def plugin_importable(monkeypatch):
    """The scenario names the plugin module (``plugins``): the Simulation Engine's Ray workers, where each ClientApp
    loads the scenario, import it from PYTHONPATH, as a deployment's nodes import an installed package."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


def _coordinates() -> int:
    from fedsim.experiment import build_experiment

    return int(build_experiment(load_scenario("quickstart", SMALL)).initial_weights.size)


def _run(*overrides: str):
    cauchy = [
        'plugins=["noise_plugin"]',
        f"privacy.mechanism.name={NAME}",
        f"privacy.mechanism.coordinates={_coordinates()}",
        "privacy.accountant=toy-pure-dp",
    ]
    return run_scenario(load_scenario("quickstart", [*SMALL, *cauchy, *overrides]), write=False)


@pytest.mark.parametrize("placement", ["central", "distributed"])
@pytest.mark.parametrize("engine", ["local", "flower"])
def test_a_cauchy_mechanism_from_outside_runs_and_is_accounted_by_its_own_release(plugin, placement, engine):
    result = _run(f"privacy.noise_placement={placement}", f"engine.name={engine}")
    strategy = result.strategy
    assert isinstance(strategy.noise, plugin.CauchyNoise)
    # the round's record names the noise kind, and the ledger holds what the mechanism declared, never a Gaussian
    assert strategy.mechanism(27).noise_kind == "cauchy"
    releases = strategy.ledger.releases
    assert [type(r.mechanism) for r in releases] == [plugin.CauchyRound, plugin.CauchyRound]
    per_round = plugin.cauchy_epsilon(Z, _coordinates())
    assert all(r.mechanism.epsilon == per_round for r in releases)
    q = releases[0].mechanism.q
    want = 2 * math.log1p(q * math.expm1(per_round))
    assert [row["epsilon"] for row in result.rows][-1] == pytest.approx(want, rel=1e-12)
    assert Ledger.from_dict(strategy.ledger.to_dict()).epsilon(1e-5, "toy-pure-dp") == pytest.approx(want)
    assert np.all(np.isfinite(result.weights))


def test_distributed_cauchy_shares_add_up_to_the_accounted_scale(plugin):
    """1-stable noise: the clients' shares (scale g/E each) and the server's top-up of the missing ones make noise of
    scale g on the sum, whatever the number of replies (the median of |Cauchy(g)| is g)."""
    noise = plugin.CauchyNoise(seed=0, coordinates=200_000)
    m = Mechanism(population=100, sampling_rate=0.1, clip=1.0, noise_multiplier=2.0, noise_kind="cauchy")
    share = noise.share_scale(m.noise_std, m.expected_cohort)
    assert share == pytest.approx(2.0 / 10)
    for replied in (10, 6, 0):
        total = sum(noise.noise(1, "share", 200_000, share, client=c) for c in range(replied))
        top_up, scale = noise.server_noise(1, 200_000, m, replied)
        assert scale == pytest.approx(2.0 * (10 - replied) / 10)
        assert np.median(np.abs(total + top_up)) == pytest.approx(2.0, rel=0.02)


def test_a_gaussian_accountant_or_calibration_is_refused_for_it_at_load(plugin):
    base = [*SMALL, f"privacy.mechanism.name={NAME}", "privacy.mechanism.coordinates=10"]
    with pytest.raises(ScenarioError, match=r"cannot account mechanism='toy-cauchy'.*allowed: toy-pure-dp"):
        load_scenario("quickstart", [*base, "privacy.accountant=pld"])
    with pytest.raises(ScenarioError, match="calibrates Gaussian noise"):
        load_scenario(
            "quickstart",
            [
                *(item for item in base if "noise_multiplier" not in item),
                "privacy.accountant=toy-pure-dp",
                "privacy.target_epsilon=4",
            ],
        )
    with pytest.raises(PrivacyInputError, match="adaptive_clip"):
        PrivacySettings(
            mechanism=NAME,
            accountant="toy-pure-dp",
            sampling_rate=0.1,
            adaptive_clipping=AdaptiveClipping(),
        )


def test_a_non_gaussian_round_is_never_given_a_gaussian_event():
    m = Mechanism(population=100, sampling_rate=0.1, noise_kind="cauchy")
    for what in (m.to_dp_event, m.pld_parameters, m.igmm_params):
        with pytest.raises(PrivacyInputError, match="never as Gaussian"):
            what()
    # the Gaussian round is saved as before (no noise_kind key); another kind round-trips
    assert "noise_kind" not in Mechanism(population=100, sampling_rate=0.1).to_dict()
    assert Mechanism.from_dict(m.to_dict()) == m


def test_a_mechanism_that_draws_without_declaring_its_release_is_refused():
    @dataclass
    class Silent(NoiseSource):  # draws Laplace noise, says nothing: it would inherit the Gaussian event
        name: ClassVar[str] = "toy-silent-laplace"

        def noise(self, round_: int, purpose: str, size: Any, std: Any, *, client: Any = None) -> Any:
            return self.rng(round_, 0).laplace(0.0, std, size)

    with pytest.raises(TypeError, match=r"does not declare noise_kind and dp_release.*Nothing is accounted"):
        register_noise_source(Silent)
    assert Silent.name not in NOISE_SOURCES

    @dataclass
    class OnlyKind(Silent):  # the kind alone is not enough: what the ledger records must be declared too
        noise_kind: ClassVar[str] = "laplace"

    with pytest.raises(TypeError, match="does not declare dp_release"):
        register_noise_source(OnlyKind)


def test_a_noise_kind_that_is_not_gaussian_must_name_its_accountants():
    @dataclass
    class Quiet(NoiseSource):
        name: ClassVar[str] = "toy-quiet-laplace"
        noise_kind: ClassVar[str] = "laplace"

        def noise(self, round_: int, purpose: str, size: Any, std: Any, *, client: Any = None) -> Any:
            return self.rng(round_, 0).laplace(0.0, std, size)

        def dp_release(self, round_: int, release: Any, schedule: Any = None) -> Any:
            return release

    with pytest.raises(TypeError, match="does not declare accountants"):
        register_noise_source(Quiet)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ('["no_such_plugin_module"]', "cannot import 'no_such_plugin_module' .ModuleNotFoundError"),
        ('["..relative"]', "cannot import '..relative'"),
        ("1", "plugins must be a list of module names"),
    ],
)
def test_a_plugin_that_cannot_be_imported_is_refused_naming_it(value, match):
    with pytest.raises(ScenarioError, match=match):
        load_scenario("quickstart", [f"plugins={value}"])
