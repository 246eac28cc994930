"""``privacy.mechanism``: a registered noise mechanism's name, or a ``[privacy.mechanism]`` table with its name and
its class's options, checked by one function (:func:`fedsim.round.mechanism_options.check_mechanism_options`) for a
scenario, ``--set``, a sweep's grid and ``fedsim privacy --option``; the options that were ``[privacy]`` keys and
flags of their own are refused naming where they went."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from fedsim.cli import main
from fedsim.round import NOISE_SOURCES, make_noise_source
from fedsim.round.mechanism_options import check_mechanism_options
from fedsim.scenarios import ScenarioError, load_scenario, scenario_to_toml
from fedsim.scenarios.schema import PrivacyConfig
from fedsim.sweep import parse_grid, plan_sweep
from fedsim.validation import PrivacyInputError

#: a cyclic schedule of 4 groups (what a correlated mechanism needs), 8 rounds; {privacy} and {rest} are filled in
SCENARIO = """
name = "mt"
rounds = 8
[data]
dataset = "digits"
num_clients = 20
[model]
name = "mlp"
hidden = [8]
[privacy]
sampling = "cyclic"
min_separation = 4
{privacy}
{rest}
"""


def _file(tmp_path: Path, privacy: str = "", rest: str = "", name: str = "mt.toml") -> str:
    path = tmp_path / name
    path.write_text(SCENARIO.format(privacy=privacy, rest=rest), encoding="utf-8")
    return str(path)


def _written(scenario) -> object:
    """``privacy.mechanism`` as the run's config.toml writes it (absent: None)."""
    return tomllib.loads(scenario_to_toml(scenario))["privacy"].get("mechanism")


def _refused(path: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path, overrides)
    return str(exc.value)


# ------------------------------------------------------------------ the two forms, and config.toml


def test_the_name_alone_is_the_mechanism_without_options_and_is_written_back_so(tmp_path):
    s = load_scenario(_file(tmp_path, 'mechanism = "tree"'))
    assert (s.privacy.mechanism_name, s.privacy.mechanism_options()) == ("tree", {})
    assert _written(s) == "tree"
    # absent: independent noise, and nothing written
    s = load_scenario(_file(tmp_path, name="none.toml"))
    assert (s.privacy.mechanism, s.privacy.mechanism_name, s.privacy.mechanism_options()) == (
        None,
        "independent",
        {},
    )
    assert _written(s) is None


def test_a_table_gives_the_options_to_the_class_and_config_toml_loads_to_the_same_scenario(tmp_path):
    s = load_scenario(_file(tmp_path, rest='[privacy.mechanism]\nname = "banded-mf"\nbands = 2'))
    assert (s.privacy.mechanism_name, s.privacy.mechanism_options()) == ("banded-mf", {"bands": 2})
    assert make_noise_source(s.privacy.mechanism_name, 0, **s.privacy.mechanism_options()).bands == 2
    assert _written(s) == {"name": "banded-mf", "bands": 2}
    again = tmp_path / "config.toml"
    again.write_text(scenario_to_toml(s), encoding="utf-8")
    assert load_scenario(str(again)).model_dump() == s.model_dump()
    # a table without options is the name alone, written back as such
    s = load_scenario(_file(tmp_path, rest='[privacy.mechanism]\nname = "blt"', name="blt.toml"))
    assert _written(s) == "blt"


def test_the_python_api_takes_either_form():
    cyclic = dict(sampling="cyclic", min_separation=4)
    assert PrivacyConfig(**cyclic, mechanism="tree").mechanism_name == "tree"
    p = PrivacyConfig(**cyclic, mechanism={"name": "tree", "estimator": "honaker"})
    assert p.mechanism_options() == {"estimator": "honaker"}
    with pytest.raises(ValidationError, match=r"estimator='foo': must be one of standard, honaker"):
        PrivacyConfig(**cyclic, mechanism={"name": "tree", "estimator": "foo"})


# ------------------------------------------------------------------ refusals, one check for every door


def test_an_option_of_another_mechanism_is_refused_naming_who_takes_it(tmp_path):
    path = _file(tmp_path, rest='[privacy.mechanism]\nname = "tree"\nbands = 3')
    assert (
        "privacy.mechanism.bands: is an option of mechanism banded-mf, not of 'tree' (its options: estimator) "
        "(got 3)"
    ) in _refused(path)
    text = _refused(_file(tmp_path, rest='[privacy.mechanism]\nname = "blt"\nbogus = 1', name="b.toml"))
    assert (
        "privacy.mechanism.bogus: is not an option of mechanism 'blt' (its options: buffers, decays, " in text
    )
    # the run's rounds are the run's, never a mechanism's option that the run would silently replace
    text = _refused(_file(tmp_path, rest='[privacy.mechanism]\nname = "blt"\nrounds = 3', name="r.toml"))
    assert "privacy.mechanism.rounds: is not set as an option: it is the run's number of rounds" in text


def test_a_value_the_class_refuses_is_refused_at_its_key(tmp_path):
    path = _file(tmp_path, 'mechanism = "banded-mf"')
    assert "privacy.mechanism.bands: must be an integer >= 1 (got 0)" in _refused(
        path, ["privacy.mechanism.bands=0"]
    )
    text = _refused(path, ["privacy.mechanism.bands=true"])
    assert "privacy.mechanism.bands: must be an integer >= 1 (got True)" in text  # never read as 1
    text = _refused(path, ["privacy.mechanism.bands=12"])  # more bands than the run's 8 rounds
    assert "privacy.mechanism.bands=12 is invalid: must be <= rounds=8" in text
    allowed = ", ".join(NOISE_SOURCES)  # the registry's names, as the schema reads them
    assert f"privacy.mechanism: must be one of {allowed} (got 'nope')" in _refused(
        path, ["privacy.mechanism=nope"]
    )


def test_the_cli_and_the_schema_refuse_with_the_same_words():
    with pytest.raises(PrivacyInputError) as exc:
        check_mechanism_options("tree", {"bands": 3})
    assert (exc.value.field, exc.value.allowed) == (
        "bands",
        "is an option of mechanism banded-mf, not of 'tree' (its options: estimator)",
    )
    with pytest.raises(PrivacyInputError, match="mechanism"):
        check_mechanism_options("nope", {})
    # none is not given; the values are returned as given
    assert check_mechanism_options("blt", {"buffers": 3, "decays": None}) == {"buffers": 3}


@pytest.mark.parametrize(
    ("privacy", "overrides", "expected"),
    [
        ('mechanism = "banded-mf"\nbands = 4', [], 'table with name = "banded-mf" and bands = 4'),
        ("", ["privacy.estimator=honaker"], 'table with name = "tree" and estimator = "honaker"'),
        # the mechanism named does not take it: the one that does is named
        ('mechanism = "tree"', ["privacy.buffers=3"], 'name = "blt" and buffers = 3'),
    ],
)
def test_an_option_at_its_old_place_is_refused_naming_its_new_key(tmp_path, privacy, overrides, expected):
    text = _refused(_file(tmp_path, privacy), overrides)
    key = expected.split(" and ")[1].split(" = ")[0]
    assert f"privacy.{key}: moved: set it as privacy.mechanism.{key}, a [privacy.mechanism] " in text
    assert expected in text and f"--set privacy.mechanism.{key}=" in text


def test_an_old_key_in_a_sweep_grid_is_refused_naming_its_new_key(tmp_path):
    path = _file(tmp_path, 'mechanism = "banded-mf"')
    with pytest.raises(ScenarioError, match=r"privacy\.bands: moved: set it as privacy\.mechanism\.bands"):
        plan_sweep(path, grid=parse_grid(["privacy.bands=1,2"]), seeds=1, out=tmp_path / "o")


# ------------------------------------------------------------------ --set and sweeps


def test_set_on_the_name_alone_makes_the_table_and_keeps_the_name(tmp_path):
    path = _file(tmp_path, 'mechanism = "banded-mf"')
    s = load_scenario(path, ["privacy.mechanism.bands=2"])
    assert (s.privacy.mechanism_name, s.privacy.mechanism_options()) == ("banded-mf", {"bands": 2})
    assert _written(s) == {"name": "banded-mf", "bands": 2}
    # the name is replaced as a value: the whole table, its options with it (they were another mechanism's)
    table = _file(tmp_path, rest='[privacy.mechanism]\nname = "banded-mf"\nbands = 2', name="t.toml")
    s = load_scenario(table, ["privacy.mechanism=tree"])
    assert (s.privacy.mechanism_name, s.privacy.mechanism_options(), _written(s)) == ("tree", {}, "tree")
    # an option set to none is removed, and the name alone is written back
    s = load_scenario(table, ["privacy.mechanism.bands=none"])
    assert (s.privacy.mechanism_options(), _written(s)) == ({}, "banded-mf")
    # no mechanism named: the table's default, independent noise, which takes no option
    none = _file(tmp_path, name="n.toml")
    assert "privacy.mechanism.bands: is an option of mechanism banded-mf, not of 'independent'" in _refused(
        none, ["privacy.mechanism.bands=2"]
    )
    s = load_scenario(none, ["privacy.mechanism.name=banded-mf", "privacy.mechanism.bands=3"])
    assert s.privacy.mechanism_options() == {"bands": 3}


def test_a_sweep_grid_over_an_option_plans_one_run_per_value(tmp_path):
    grid = '[sweep]\nseeds = 1\n[sweep.grid]\n"privacy.mechanism.bands" = [1, 2, 4]'
    path = _file(tmp_path, 'mechanism = "banded-mf"', grid)
    _, runs = plan_sweep(path, out=tmp_path / "o")
    assert [r.setting for r in runs] == [{"privacy.mechanism.bands": b} for b in (1, 2, 4)]
    resolved = [load_scenario(path, r.overrides).privacy for r in runs]
    assert [(p.mechanism_name, p.mechanism_options()) for p in resolved] == [
        ("banded-mf", {"bands": b}) for b in (1, 2, 4)
    ]
    # --grid likewise, over a variant that names the mechanism
    variants = '[sweep]\nseeds = 1\n[[sweep.variants]]\nlabel = "mf"\n"privacy.mechanism" = "banded-mf"'
    path = _file(tmp_path, rest=variants, name="v.toml")
    _, runs = plan_sweep(path, grid=parse_grid(["privacy.mechanism.bands=1,2"]), out=tmp_path / "v")
    assert [load_scenario(path, r.overrides).privacy.mechanism_options() for r in runs] == [
        {"bands": 1},
        {"bands": 2},
    ]


# ------------------------------------------------------------------ fedsim privacy --option

#: ``fedsim privacy`` for banded-mf with 2 bands on a cyclic schedule of 4 groups, 20 rounds, by rdp
PRIVACY = ["privacy", "--population", "100", "--sampling", "cyclic", "--min-separation", "4"]
PRIVACY += ["--noise-multiplier", "1.0", "--rounds", "20", "--delta", "1e-5", "--methods", "rdp"]
#: what it printed with ``--bands 2``, before the flag became ``--option bands=2``
BANDS_2 = """\
population 100, cyclic b=4, add-remove, clip 1, noise multiplier 1, delta 1e-05, 20 rounds
mechanism: banded matrix factorization, 2 bands (c = 1, 0.625); cyclic schedule, min separation 4; no amplification claimed
sensitivity (the whole run): 2.63742 x clip

 round         rdp
     1       4.729
     5       7.867
    10       11.01
    15       13.15
    20       15.12

epsilon at the given delta, certified by dp-accounting
"""


def test_fedsim_privacy_option_prints_what_the_old_flag_printed(capsys):
    assert main([*PRIVACY, "--mechanism", "banded-mf", "--option", "bands=2"]) == 0
    assert capsys.readouterr().out == BANDS_2
    # blt with 3 buffers: what --buffers 3 printed (the optimised decays and scales, the sensitivity, epsilon)
    assert main([*PRIVACY, "--mechanism", "blt", "--option", "buffers=3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mechanism"]["noise"] == (
        "buffered-linear-Toeplitz noise, 3 buffers (decay/scale 0.5459/0.159, 0.5459/0.318, 0.5459/0.159)"
    )
    assert doc["sensitivity"] == pytest.approx(3.029559326144681, rel=1e-12)
    assert doc["methods"]["rdp"]["epsilon"][-1] == pytest.approx(18.026384669919153, rel=1e-12)


def _privacy_error(capsys, argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_fedsim_privacy_option_is_checked_as_a_scenario_is(capsys):
    tree = [*PRIVACY, "--mechanism", "tree"]
    assert _privacy_error(capsys, [*tree, "--option", "bands=3"]) == (
        "fedsim privacy: error: --option bands: 3 is invalid: is an option of mechanism banded-mf, not of 'tree' "
        "(its options: estimator)"
    )
    assert _privacy_error(capsys, [*tree, "--option", "estimator=foo"]) == (
        "fedsim privacy: error: --option estimator: 'foo' is invalid: must be one of standard, honaker"
    )
    assert "--option: 'estimator' is invalid: must be KEY=VALUE" in _privacy_error(
        capsys, [*tree, "--option", "estimator"]
    )
    blt = [*PRIVACY, "--mechanism", "blt"]
    assert "--option decays/output_scales: " in _privacy_error(capsys, [*blt, "--option", "decays=[0.5]"])
    # the flags the options were: refused, naming the --option to give
    assert _privacy_error(capsys, [*tree, "--estimator", "honaker"]) == (
        "fedsim privacy: error: --estimator moved: give it as --option estimator=honaker"
    )
