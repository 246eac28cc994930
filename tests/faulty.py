"""Clients that fail the ways real ones do, for the fault tests: a data function that marks chosen clients and a
model that, while training (``model.train()``; evaluation works), acts on the mark in its input.

Scenarios name them ``"faulty:data"`` and ``"faulty:model"`` (tests/conftest.py puts this folder on ``sys.path``
and the engines hand that path to their workers). ``[data.options] faults = {"3" = "raise"}`` marks client 3.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch
from torch import nn

#: what a marked client's training does: raise, produce NaN (its loss and so its update), hang, kill its process;
#: ``kill_eval``: its evaluation (not its training) kills the process
CODES = {"raise": 101.0, "nan": 102.0, "sleep": 103.0, "kill": 104.0, "kill_eval": 105.0}


def data(num_clients: int, seed: int, faults: dict | None = None, per_client: int = 10, features: int = 5):
    """``num_clients`` clients of ``per_client`` Gaussian examples, 2 classes; the first feature of every example
    of a client in ``faults`` (``{client index: "raise" | "nan" | "sleep" | "kill"}``) is that fault's code."""
    rng = np.random.default_rng(seed)
    n = num_clients * per_client
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = (x[:, 1] > 0).astype(np.int64)
    clients = [np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)]
    for cid, kind in (faults or {}).items():
        x[clients[int(cid)], 0] = CODES[kind]
    return {"x": x, "y": y, "clients": clients}


class Faulty(nn.Module):
    def __init__(self, features: int, classes: int, sleep_s: float) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, 8)
        self.out = nn.Linear(8, classes)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        code = x[:, 0]
        if not self.training and bool((code == CODES["kill_eval"]).any()):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.training:
            if bool((code == CODES["raise"]).any()):
                raise RuntimeError("injected fault: this client's data breaks the model")
            if bool((code == CODES["kill"]).any()):
                os.kill(os.getpid(), signal.SIGKILL)
            if bool((code == CODES["sleep"]).any()):
                time.sleep(self.sleep_s)
        h = torch.tanh(self.hidden(x))
        if (
            self.training
        ):  # NaN times the marked rows: NaN loss, NaN gradients, a NaN update for that client only
            h = h * torch.where(code == CODES["nan"], torch.nan, 1.0)[:, None]
        return self.out(h)


def model(input_shape, num_classes, sleep_s: float = 60.0):
    return Faulty(int(input_shape[0]), num_classes, sleep_s)


#: a scenario of these clients (scenario_file fills it in)
SCENARIO = """
name = "faults"
seed = 5
rounds = 2

[data]
dataset = "faulty:data"
num_clients = {clients}
heldout_fraction = 0.0

[data.options]
faults = {faults}

[model]
factory = "faulty:model"
sleep_s = 60.0

[client]
local_epochs = 1
batch_size = 5

[privacy]
sampling = "all"
clip = 1.0
noise_multiplier = 0.8

[engine]
name = "{engine}"
num_workers = 2
vectorize = "{vectorize}"
{extra}
"""


def scenario_file(tmp_path, *, clients=8, faults=None, engine="local", vectorize="auto", extra="", name="s"):
    """Write a scenario of ``clients`` clients, ``faults`` ({client: code of CODES}) marked, to ``tmp_path/name.toml``;
    return its path."""
    table = "{" + ", ".join(f'"{k}" = "{v}"' for k, v in (faults or {}).items()) + "}"
    path = tmp_path / f"{name}.toml"
    path.write_text(
        SCENARIO.format(clients=clients, faults=table, engine=engine, vectorize=vectorize, extra=extra)
    )
    return path
