"""The client-level loss-threshold membership-inference attack: known answers, and a model that memorises its
members (random labels, little noise) against one that cannot (heavy noise)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.engine.runner import run_scenario
from fedsim.report.attack import client_losses, loss_threshold_attack
from fedsim.scenarios import load_scenario


def rng():
    return np.random.default_rng(0)


def test_separated_losses_are_found_and_reversed_ones_are_not():
    got = loss_threshold_attack(np.full(20, 0.1), np.full(20, 2.0), rng())
    assert got == {"accuracy": 1.0, "accuracy_train_mean": 1.0, "auc": 1.0, "pairs": 20}
    # members with the higher loss: no threshold "member if loss <= t" beats guessing all non-members
    got = loss_threshold_attack(np.full(20, 2.0), np.full(20, 0.1), rng())
    assert got["accuracy"] == 0.5 and got["auc"] == 0.0
    got = loss_threshold_attack(np.ones(7), np.ones(7), rng())  # indistinguishable: chance, ties split
    assert got["accuracy"] == 0.5 and got["auc"] == 0.5


def test_the_sets_are_balanced_and_the_accuracy_is_exact():
    members, nonmembers = np.arange(100) / 100, np.array([0.055, 0.5, 2.0, 3.0])
    got = loss_threshold_attack(members, nonmembers, rng())
    assert got["pairs"] == 4
    # 4 members drawn from [0, 1), non-members 0.055, 0.5, 2, 3: the best threshold errs on at most 2 of 8
    assert got["accuracy"] >= 0.75
    same = loss_threshold_attack(members, nonmembers, rng())
    assert same == got  # the draw is the generator's
    big = loss_threshold_attack(rng().normal(size=4000), rng().normal(size=4000) + 1.0, rng())
    # N(0,1) against N(1,1): AUC = Phi(1/sqrt 2) = 0.760, best accuracy = Phi(1/2) = 0.691
    assert big["auc"] == pytest.approx(0.760, abs=0.02) and big["accuracy"] == pytest.approx(0.691, abs=0.02)


def test_client_losses_are_per_client_means_of_clients_with_data():
    rows = np.array([[0, 4, 2.0, 1], [1, 0, 0.0, 0], [2, 2, 3.0, 2]])
    np.testing.assert_allclose(client_losses(rows), [0.5, 1.5])


SCENARIO = """
name = "memorise"
seed = 3
rounds = {rounds}

[data]
dataset = "user_models:random_labels"
num_clients = 40
heldout_fraction = 0.5

[model]
factory = "user_models:mlp"
width = 256

[client]
local_epochs = {epochs}
batch_size = 8
lr = 0.5

[privacy]
sampling = "all"
clip = {clip}
noise_multiplier = {z}
accountant = "rdp"

[report]
membership_attack = true

[engine]
name = "local"
"""


def _last_attack(tmp_path, name, **kw):
    path = tmp_path / f"{name}.toml"
    path.write_text(SCENARIO.format(**kw))
    result = run_scenario(load_scenario(str(path)), tmp_path / name)
    return result.rows[-1]["non_private"]["attack"]


def test_a_model_that_memorises_its_members_is_caught_and_a_noised_one_is_not(tmp_path):
    memorised = _last_attack(tmp_path, "memorised", rounds=8, epochs=20, clip=100.0, z=0.01)
    assert memorised["pairs"] == 20 and memorised["accuracy"] >= 0.9 and memorised["auc"] >= 0.9, memorised
    noised = _last_attack(tmp_path, "noised", rounds=8, epochs=20, clip=0.001, z=5.0)
    # no signal: the best threshold on 20 pairs beats 0.5 by chance (0.59 on average, 0.68 at the 95th
    # percentile); the AUC's sd is 0.09
    assert noised["accuracy"] <= 0.8 and 0.2 <= noised["auc"] <= 0.8, noised
