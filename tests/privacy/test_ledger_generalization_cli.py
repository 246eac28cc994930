import json
import math

import numpy as np
import pytest

from fedsim.privacy import Ledger, Mechanism, PrivacyInputError, compose_same_cohort, epsilon_curve
from fedsim.privacy.accountants import epsilon_at
from fedsim.privacy.paper import corollary3_curve, generalization_statement, min_population
from fedsim.privacy.paper.calibration import calibrate_noise
from fedsim.privacy.paper.generalization import precondition_n, statement_curve, theorem1_ab
from fedsim.report.privacy import add_parser, build_parser, main, run

M = Mechanism(population=1000, sampling_rate=0.05, noise_multiplier=1.2)


# ---------------------------------------------------------------- ledger
def test_ledger_matches_curve_and_is_incremental():
    led = Ledger()
    assert led.epsilon(1e-5) == 0.0 and led.rounds == 0 and len(led) == 0
    eps = []
    for t in range(1, 21):
        led.record(round=t, mechanism=M, name="model")
        eps.append(led.epsilon(1e-5))
    assert led.rounds == 20 and len(led) == 20
    curve = epsilon_curve(M, 20, 1e-5, "pld")
    assert np.allclose(eps, curve, rtol=1e-6)
    assert led.epsilon(1e-5, "rdp") == pytest.approx(epsilon_curve(M, 20, 1e-5, "rdp")[-1], rel=1e-12)
    assert led.epsilon(1e-5, "igmm-corrected") == pytest.approx(
        epsilon_curve(M, 20, 1e-5, "igmm-corrected")[-1]
    )


def test_two_releases_in_one_round_compose_before_sampling():
    count = Mechanism(population=1000, sampling_rate=0.05, clip=1.0, noise_multiplier=4.0)  # noised 0/1 count
    led = Ledger()
    for t in (1, 2, 3):
        led.record(round=t, mechanism=M, name="model")
        led.record(round=t, mechanism=count, name="clip-count")
    assert led.rounds == 3 and len(led) == 6
    z_eff = (1.2**-2 + 4.0**-2) ** -0.5
    assert compose_same_cohort([M, count]).noise_multiplier == pytest.approx(z_eff)
    single = epsilon_at(M.replace(noise_multiplier=z_eff), 3, 1e-5, "pld")
    assert led.epsilon(1e-5) == pytest.approx(single, rel=1e-6)
    # treating the releases as independently sampled would UNDER-report (each would get its own
    # amplification although the same clients are in both): the ledger must not do that
    sep = Ledger()
    for t in (1, 2, 3):
        sep.record(round=t, mechanism=M)
        sep.record(round=t, mechanism=count.replace(sampling_rate=0.0500001))  # different cohort key
    assert epsilon_at(M, 3, 1e-5, "pld") < sep.epsilon(1e-5) < led.epsilon(1e-5)


def test_heterogeneous_serialisation_and_would_exceed(tmp_path):
    led = Ledger()
    led.record(round=1, mechanism=M)
    led.record(round=2, mechanism=M.replace(clip=0.5))  # adaptive clipping: same z, new clip
    led.record(round=3, mechanism=M.replace(noise_multiplier=2.0))
    e = led.epsilon(1e-5)
    before = (led.rounds, len(led), led.to_dict())
    assert led.would_exceed(M, e * 1.0001, 1e-5) is True
    assert led.would_exceed(M, 1e6, 1e-5) is False
    assert led.would_exceed(M, 1e6, 1e-5, releases=[M.replace(noise_multiplier=3.0)]) is False
    assert (led.rounds, len(led), led.to_dict()) == before and led.epsilon(1e-5) == e
    p = tmp_path / "ledger.json"
    led.save(p)
    back = Ledger.load(p)
    assert back.to_dict() == led.to_dict() and back.epsilon(1e-5) == pytest.approx(e, rel=1e-12)
    assert json.loads(p.read_text())["releases"][1]["mechanism"]["clip"] == 0.5
    with pytest.raises(PrivacyInputError):
        led.record(round=2, mechanism=M)  # append-only
    with pytest.raises(PrivacyInputError):
        led.epsilon(1e-5, "igmm")  # heterogeneous: closed form needs a homogeneous ledger
    assert led.epsilon(1e-5, "basic") >= e


def test_ledger_mixed_relations_uses_replace_one():
    f = Mechanism(population=1000, sampling="fixed", clients_per_round=50, noise_multiplier=1.2)
    led = Ledger()
    led.record(round=1, mechanism=M)
    led.record(round=2, mechanism=f)
    assert led.epsilon(1e-5) > Ledger.from_dict(led.to_dict()).epsilon(1e-5) - 1e-12
    with pytest.raises(PrivacyInputError):
        led.epsilon(1e-5, "rdp")


# ---------------------------------------------------------------- generalization
def test_theorem1_constants_and_sheet_claims():
    a, b = theorem1_ab(0.1, 1e-5)
    assert a == pytest.approx(0.4) and b == pytest.approx(2 * math.exp(-0.17) * 1e-5 / 0.1 * math.log(20))
    a, b = theorem1_ab(1.0, 1e-5)
    g = 1 - 0.9 * math.exp(-1)
    assert a == pytest.approx(1.2 * g) and b == pytest.approx(
        18 * math.exp(-1) * 1e-5 / g * math.log(220 / g)
    )
    e = np.geomspace(1e-9, 10, 20001)
    # the second precondition term alone needs N >= 1669 for every eps; eps <= 1/5 needs N >= 6543
    t2 = 200 / np.log(0.9 * (1 - 0.9 * np.exp(-e))) * np.log(9 * np.exp(-e) * 1e-5 / 48180)
    assert 1668 < t2.min() < 1670
    assert 6543 <= precondition_n(np.append(e[e <= 0.2], 0.2), 1e-5).min() < 6544
    n = precondition_n(0.05, 1e-5, "arxiv")
    assert n == pytest.approx(2 / 0.05**2 * math.log(16 / (math.exp(-0.05) * 1e-5)))


def test_statement_statuses_and_n_min():
    s = generalization_statement(0.5, 1e-5, 100)
    assert s["status"] == "no-statement" and s["a"] is None and s["n_min"] > 100
    ok = generalization_statement(0.5, 1e-5, s["n_min"])
    assert ok["status"] == "ok" and ok["eps_used"] >= 0.5
    assert generalization_statement(0.5, 1e-5, s["n_min"] - 1)["status"] == "no-statement"
    assert generalization_statement(3.0, 1e-5, 10**6)["status"] == "vacuous"
    assert generalization_statement(float("inf"), 1e-5, 10**6)["status"] == "no-statement"
    # eps just above 1/5 gives a smaller a than 4*eps once 4*eps > 0.316
    s = generalization_statement(0.15, 1e-5, 10**6)
    assert s["status"] == "ok" and s["a"] < 0.6 and s["eps_used"] > 0.2
    ax = generalization_statement(0.01, 1e-5, 10**7, version="arxiv")
    assert ax["status"] == "ok" and ax["a"] == pytest.approx(9 * ax["eps_used"])
    rows = statement_curve([0.01, 0.5, 3.0, np.inf], 1e-5, 10**5)
    assert [r["status"] for r in rows] == ["ok", "ok", "vacuous", "no-statement"]
    with pytest.raises(PrivacyInputError):
        generalization_statement(0.5, 1.5, 100)
    with pytest.raises(PrivacyInputError):
        generalization_statement(0.5, 1e-5, 100, version="icml")


def test_corollary3_rate_and_min_population():
    C = np.array([10**6, 4 * 10**6, 16 * 10**6])  # large enough for the a = 4 eps branch
    cur = corollary3_curve(C, delta=1e-6)
    assert list(cur["status"]) == ["ok"] * 3
    assert np.all(np.diff(cur["a"]) < 0)
    ratio = cur["a"][1:] / cur["a"][:-1]  # a = O~(1/sqrt(C)): quadrupling C roughly halves a
    assert np.all((ratio > 0.4) & (ratio < 0.65))
    m = Mechanism(population=2000, sampling_rate=0.05, noise_multiplier=3.0)
    n = min_population(m, 10, 1e-5, method="rdp")
    e = epsilon_at(m, 10, 1e-5, "rdp")
    assert generalization_statement(e, 1e-5, n)["status"] == "ok"
    assert generalization_statement(e, 1e-5, n - 1)["status"] != "ok"


def test_calibration():
    z = calibrate_noise(M, 2.0, 1e-5, 50, "rdp")
    assert epsilon_at(M.replace(noise_multiplier=z), 50, 1e-5, "rdp") <= 2.0
    assert epsilon_at(M.replace(noise_multiplier=z * 0.99), 50, 1e-5, "rdp") > 2.0
    zp = calibrate_noise(M, 2.0, 1e-5, 50, "pld", z_min=0.5, z_max=4.0, rel_tol=1e-2)
    assert epsilon_at(M.replace(noise_multiplier=zp), 50, 1e-5, "pld") <= 2.0 and zp <= z * 1.01
    zi = calibrate_noise(M, 2.0, 1e-5, 50, "igmm")
    assert zi is None or zi > 0


# ---------------------------------------------------------------- CLI
def _args(argv):
    return build_parser().parse_args(argv)


BASE = [
    "--population",
    "1000",
    "--clients-per-round",
    "50",
    "--sampling",
    "fixed",
    "--noise-multiplier",
    "1.5",
    "--rounds",
    "60",
    "--delta",
    "1e-5",
]


def test_cli_human(capsys):
    assert run(_args(BASE)) == 0
    out = capsys.readouterr().out
    assert "round" in out and "pld" in out and "igmm*" in out and "paper bound; " in out
    assert "\n   60" in out or "\n60" in out


def test_cli_json(capsys):
    assert main([*BASE, "--json", "--methods", "pld", "rdp", "igmm"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["methods"]) == {"pld", "rdp", "igmm"}
    assert len(doc["methods"]["pld"]["epsilon"]) == 60 and doc["methods"]["igmm"]["certified"] is False
    assert len(doc["generalization"]["uai"]) == 60 and "n_min" in doc["generalization"]["uai"][0]
    assert doc["audit"]["igmm"]["verdict"].startswith("paper bound; ")


def test_cli_calibration(capsys):
    argv = [
        "--population",
        "1000",
        "--sampling-rate",
        "0.05",
        "--rounds",
        "20",
        "--target-epsilon",
        "3",
        "--methods",
        "rdp",
        "basic",
        "--json",
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["rdp"] > 0 and doc["methods"]["rdp"]["epsilon"][-1] <= 3.0


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--sampling-rate", "1.5"], "--sampling-rate"),
        (["--sampling-rate", "0.1", "--delta", "1"], "--delta"),
        (["--sampling-rate", "0.1", "--noise-multiplier", "-0.5"], "--noise-multiplier"),
        (["--sampling-rate", "0.1", "--clip", "-1"], "--clip"),
        (["--sampling-rate", "0.1", "--rounds", "0"], "--rounds"),
        (["--sampling-rate", "0.1", "--methods", "moments"], "--methods"),
        (["--sampling", "fixed", "--sampling-rate", "0.1234"], "--sampling-rate"),
    ],
)
def test_cli_errors(argv, option, capsys):
    base = {"--population": "100", "--rounds": "5", "--noise-multiplier": "1"}
    full = list(argv)
    for k, v in base.items():
        if k not in full:
            full += [k, v]
    assert run(_args(full)) == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_add_parser_registers_subcommand():
    import argparse

    p = argparse.ArgumentParser(prog="fedsim")
    sub = p.add_subparsers(dest="command")
    add_parser(sub)
    args = p.parse_args(
        [
            "privacy",
            "--population",
            "10",
            "--sampling",
            "all",
            "--noise-multiplier",
            "5",
            "--rounds",
            "3",
            "--methods",
            "rdp",
        ]
    )
    assert args.func is run


def test_module_entry_point():
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim.report.privacy",
            "--population",
            "10",
            "--sampling",
            "all",
            "--noise-multiplier",
            "5",
            "--rounds",
            "3",
            "--methods",
            "rdp",
            "basic",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["methods"]["rdp"]["epsilon"][0] > 0
