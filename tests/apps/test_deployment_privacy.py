"""The shipped ServerApp and ClientApp, as deployed: what crosses the wire and what can be regenerated from a config.

The apps run in process on a loopback Grid (``loopback.py``): the ServerApp's ``main`` is the one
``flwr run .`` starts on a SuperLink, the ClientApp the one each SuperNode runs.
"""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from loopback import LoopbackGrid  # tests/apps/loopback.py (pytest puts this folder on sys.path)

from fedsim.apps import client_app as client_module
from fedsim.apps import server_app as server_module
from fedsim.apps.run_config import load_for_run, model_record
from fedsim.experiment import build_strategy
from fedsim.flower.grid import ClientIdGrid
from fedsim.round import STREAM_NOISE, STREAM_NOISE_SHARE, clip_update, flatten, make_rng
from fedsim.training.trainer import initial_weights

NODES = 4


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower stamps messages with the run's identity, which a SuperLink process sets; set it as one would."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


BASE = (
    "seed=0 rounds=2 data.num_clients=5 data.heldout_fraction=0.2 client.local_epochs=1 privacy.sampling=all "
    "privacy.sampling_rate=none privacy.clip=1.0 privacy.noise_multiplier=1.0 engine.name=local"
)


def _deploy(tmp_path, name: str, overrides: str = BASE, **run_config) -> LoopbackGrid:
    cfg = {
        "scenario": "quickstart",
        "overrides": overrides,
        "min-nodes": NODES,
        "run-dir": str(tmp_path / name),
        **run_config,
    }
    grid = LoopbackGrid(client_module.app, NODES, cfg)
    server_module.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return grid


def _train_rounds(grid: LoopbackGrid) -> tuple[list[np.ndarray], list[dict[int, np.ndarray]]]:
    """The global model each round's train messages carried, and each round's replies by destination node."""
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    rounds = sorted({int(m.content["config"]["server-round"]) for m in sent})
    models, replies = [], []
    by_id = {r.metadata.reply_to_message_id: r for r in grid.replies}
    for t in rounds:
        msgs = [m for m in sent if int(m.content["config"]["server-round"]) == t]
        models.append(flatten(next(iter(msgs[0].content.array_records.values())).to_numpy_ndarrays()))
        replies.append({int(m.metadata.dst_node_id): by_id[m.metadata.message_id] for m in msgs})
    return models, replies


def _released_noise(grid: LoopbackGrid) -> np.ndarray:
    """What an observer who also knows every client's update recovers: the noise added in round 1
    (``m * (w1 - w0) - sum_i clip(update_i)``, sampling 'all': m = 4, server SGD with lr 1)."""
    (w0, w1), (round1, _) = _train_rounds(grid)
    total = sum(
        clip_update(flatten(next(iter(r.content.array_records.values())).to_numpy_ndarrays()) - w0, 1.0)[0]
        for r in round1.values()
    )
    return NODES * (w1 - w0) - total


def _regenerated(seed: int, size: int) -> np.ndarray:
    """The round-1 noise a seeded strategy draws: what anyone holding the scenario file can compute."""
    return make_rng(seed, 1, STREAM_NOISE).normal(0.0, 1.0, size=size)


def test_deployed_noise_comes_from_os_entropy_and_cannot_be_regenerated(tmp_path):
    first, second = _deploy(tmp_path, "a"), _deploy(tmp_path, "b")
    n1, n2 = _released_noise(first), _released_noise(second)
    assert n1.size > 100 and 0.8 < n1.std() < 1.2  # the noise is there, with std z*clip = 1
    assert np.max(np.abs(n1 - n2)) > 1.0  # two deployed runs of the same scenario release different noise
    for run in ("a", "b"):
        config = tomllib.loads((tmp_path / run / "config.toml").read_text())
        assert config["privacy"]["randomness"] == "os-entropy"
        rows = [line for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines() if line]
        assert len(rows) == 2 and '"epsilon"' in rows[-1]
        for seed in {config["seed"], 0, 1}:  # the config's seed, and the defaults, regenerate nothing
            assert np.max(np.abs(n1 - _regenerated(seed, n1.size))) > 1.0


def test_the_attack_recovers_seeded_noise(tmp_path):
    """The check above can fail: with a seeded strategy (what the ServerApp used to build from the scenario's
    seed), the same observer recovers the noise to float32 rounding from the scenario file alone."""
    cfg = {"scenario": "quickstart", "overrides": BASE}
    scenario, data, trainer = load_for_run(cfg)
    strategy = build_strategy(scenario, population=None, data=data)
    assert strategy.seed == 0 and strategy.randomness == "seeded"
    grid = LoopbackGrid(client_module.app, NODES, cfg)
    initial = model_record(trainer, initial_weights(trainer.settings, data.input_dim, data.num_classes))
    # a user's own ServerApp: Flower's strategy.start() drives the strategy's Message API
    strategy.start(grid=ClientIdGrid(grid, min_nodes=NODES), initial_arrays=initial, num_rounds=2)
    noise = _released_noise(grid)
    assert np.max(np.abs(noise - _regenerated(0, noise.size))) < 1e-4


def test_deployed_distributed_noise_is_refused_without_secure_aggregation_unless_opted_in(tmp_path):
    overrides = f"{BASE} privacy.noise_placement=distributed"
    with pytest.raises(ValueError, match="refused with Flower nodes without secure aggregation"):
        _deploy(tmp_path, "refused", overrides)
    assert not (tmp_path / "refused").exists()  # refused before anything ran or was written
    grid = _deploy(tmp_path, "opted-in", overrides, **{server_module.DISTRIBUTED_OPT_IN: True})
    assert grid.replies and (tmp_path / "opted-in" / "metrics.jsonl").is_file()


def test_deployed_distributed_shares_come_from_os_entropy_and_replies_carry_no_raw_statistic(tmp_path):
    overrides = f"{BASE} privacy.noise_placement=distributed privacy.adaptive_clip=true"
    opt_in = {server_module.DISTRIBUTED_OPT_IN: True}
    runs = [_deploy(tmp_path, name, overrides, **opt_in) for name in ("a", "b")]
    (w0a, _), (ra, _) = _train_rounds(runs[0])
    (w0b, _), (rb, _) = _train_rounds(runs[1])
    np.testing.assert_array_equal(w0a, w0b)  # same initial model (the seed still sets model and data)
    scenario, data, _ = load_for_run({"scenario": "quickstart", "overrides": overrides})
    share_std = 1.0 / math.sqrt(NODES)
    node_to_client = {node: int(data.train_clients[i]) for i, node in enumerate(runs[0].node_ids)}
    for node in runs[0].node_ids:
        a, b = (
            flatten(next(iter(r[node].content.array_records.values())).to_numpy_ndarrays()) for r in (ra, rb)
        )
        # the same client, the same local training: the replies differ only by the client's own noise share
        diff = a - b
        assert 0.8 * share_std * math.sqrt(2) < diff.std() < 1.2 * share_std * math.sqrt(2)
        seeded = make_rng(scenario.seed, 1, STREAM_NOISE_SHARE, node_to_client[node]).normal(
            0.0, share_std, a.size
        )
        assert np.max(np.abs((a - w0a) - seeded)) > 1.0
        for reply in (ra[node], rb[node]):
            metrics = {k: v for rec in reply.content.metric_records.values() for k, v in rec.items()}
            # only the client's noised unclipped bit: no norm, no raw bit, no loss, no number of examples
            assert set(metrics) == {"fedsim.unclipped-noised"}
            assert metrics["fedsim.unclipped-noised"] not in (0.0, 1.0)


def test_deployed_rows_hold_only_private_values_unless_diagnostics_are_asked_for(tmp_path):
    import json

    quiet = _deploy(tmp_path, "quiet")
    rows = [json.loads(x) for x in (tmp_path / "quiet" / "metrics.jsonl").read_text().splitlines() if x]
    assert rows and all(
        "non_private" not in r and "cohort" not in r and "train_accuracy" not in r for r in rows
    )
    assert all("heldout_accuracy" in r and r["epsilon"] > 0 for r in rows)
    assert quiet.replies
    # exact per-client statistics: written only with diagnostics
    assert not (tmp_path / "quiet" / "data.json").exists()
    _deploy(tmp_path, "loud", diagnostics=True)
    assert (tmp_path / "loud" / "data.json").is_file()
    rows = [json.loads(x) for x in (tmp_path / "loud" / "metrics.jsonl").read_text().splitlines() if x]
    assert all(r["non_private"]["cohort"] == NODES and "train_accuracy" in r["non_private"] for r in rows)


@pytest.mark.parametrize(
    "sampling",
    [
        "privacy.sampling=poisson privacy.sampling_rate=0.5",
        "privacy.sampling=fixed privacy.sampling_rate=none privacy.clients_per_round=2",
    ],
)
def test_a_deployed_run_has_the_ledger_and_epsilons_of_the_simulated_run(tmp_path, sampling):
    """Same scenario and rounds, deployed (OS entropy, one node per training client) and simulated (seeded): the
    same releases are accounted, so the ledgers and the certified epsilons are equal; the noise is not."""
    import json

    from fedsim.engine.runner import run_scenario
    from fedsim.scenarios import load_scenario

    overrides = f"{BASE.replace('privacy.sampling=all privacy.sampling_rate=none ', '')} {sampling}"
    _deploy(tmp_path, "deployed", overrides)
    simulated = run_scenario(load_scenario("quickstart", overrides.split()), tmp_path / "simulated")
    ledgers = [json.loads((tmp_path / d / "ledger.json").read_text()) for d in ("deployed", "simulated")]
    assert ledgers[0] == ledgers[1] and len(ledgers[0]["releases"]) == 2
    rows = [json.loads(x) for x in (tmp_path / "deployed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epsilon"] for r in rows] == [r["epsilon"] for r in simulated.rows]
    assert [r["randomness"] for r in rows] == ["os-entropy"] * 2 and simulated.rows[0][
        "randomness"
    ] == "seeded"
