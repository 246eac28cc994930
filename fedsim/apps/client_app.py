"""The fedsim ClientApp: one node = one training client of the scenario.

It trains with the same :class:`~fedsim.training.trainer.ClientTrainer` as the Ray engine and, when the
server asks for distributed noise (``fedsim.noise-share-std`` in the config), clips its update and adds its
own noise share before the update leaves the node. Nothing happens at import time.

What a reply carries, and nothing more: the model (``global + update``); with agnostic FL, the client's bounded
loss of the global model (a value in [0, 1] that the server adds to a noised, accounted sum). With distributed
noise the update is clipped and noised here, and with adaptive clipping the unclipped bit is noised here too
(``fedsim.unclipped-noised``): no un-noised per-client statistic (norm, bit, loss, number of examples) leaves
the node. The noise shares of the shipped ``app`` come from the operating system's entropy, whatever the server
asks; only fedsim's simulator builds a ClientApp with seeded shares (:func:`make_client_app`'s ``noise_seed``).

``app`` reads the scenario from the run config (or, when that is empty as under
``flwr.simulation.run_simulation``, from ``FEDSIM_SCENARIO`` / ``FEDSIM_OVERRIDES``).
:func:`make_client_app` builds the same ClientApp with run-config defaults baked in (the
:class:`~fedsim.engine.flower_engine.FlowerEngine` uses it, so it needs no environment variables).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim.flower.grid import KEY_CLIENT_ID, KEY_PARTITION_ID
from fedsim.flower.protocol import (
    CFG_CLIP,
    CFG_COUNT_NOISE_STD,
    CFG_LOSS_BOUND,
    CFG_NOISE_STD,
    CFG_ROUND,
    MET_LOSS,
    MET_UNCLIPPED_NOISED,
)
from fedsim.round import flatten

from .run_config import load_for_run, model_arrays


def _client_id(data, context: Context) -> int:
    try:
        pid = int(context.node_config["partition-id"])
    except (KeyError, ValueError, TypeError):
        raise ValueError(
            "this SuperNode has no integer 'partition-id' in its node config; start it with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None
    train = np.asarray(data.train_clients)
    if not 0 <= pid < train.size:
        raise ValueError(
            f"partition-id={pid} is outside 0..{train.size - 1} (training clients of the scenario)"
        )
    return int(train[pid])


def _global(msg: Message) -> tuple[ArrayRecord, np.ndarray]:
    arrays = next(iter(msg.content.array_records.values()))
    return arrays, flatten(arrays.to_numpy_ndarrays())


def make_client_app(run_config_defaults: dict | None = None, *, noise_seed: int | None = None) -> ClientApp:
    """The fedsim ClientApp; ``run_config_defaults`` fill keys the run config lacks (e.g. ``scenario``).

    ``noise_seed``: seeds the distributed noise shares from ``(noise_seed, round, client)``, for simulations that
    must be reproducible. ``None`` (the shipped ``app``): the operating system's entropy. It is a property of the
    node's code, never of a message, so a server cannot make clients draw noise it could regenerate.
    """
    defaults = dict(run_config_defaults or {})
    app = ClientApp()

    def _config(context: Context) -> dict:
        return {**defaults, **dict(context.run_config)} if defaults else dict(context.run_config)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        _scenario, data, trainer = load_for_run(_config(context))
        cid = _client_id(data, context)
        config = next(iter(msg.content.config_records.values()))
        server_round = int(config.get(CFG_ROUND, 0))
        global_arrays, flat = _global(msg)
        share_std = float(config.get(CFG_NOISE_STD, 0.0))
        loss_bound = config.get(CFG_LOSS_BOUND)
        extra: dict[str, float] = {}
        if share_std > 0:
            # distributed noise: the trainer clips and adds this client's share before the update leaves it
            count_share = float(config.get(CFG_COUNT_NOISE_STD, 0.0))
            partial, metrics = trainer.train(
                server_round,
                [cid],
                flat,
                float(config[CFG_CLIP]),
                share_std,
                noise_seed=noise_seed,
                count_share_std=count_share,
            )
            if partial.rejected:  # an error reply: the server counts it and tops up this client's noise share
                why = metrics[0].get("error", "a non-finite update") if metrics else "no update"
                raise ValueError(f"client {cid}: local training failed ({why})")
            update = partial.total
            if count_share > 0:
                extra[MET_UNCLIPPED_NOISED] = float(partial.unclipped_noised)
        else:  # central noise: the raw update goes to the server, which clips it (and counts unclipped norms)
            global_w = torch.as_tensor(flat, dtype=torch.float32, device=trainer.device)
            if loss_bound is not None:
                extra[MET_LOSS] = trainer.bounded_loss(cid, float(loss_bound), weights=global_w)
            update, _ = trainer.train_one(cid, server_round, global_w)
            update = update.double().cpu().numpy()
        # echo the server's array names so the reply matches the global model key for key
        new = model_arrays(trainer, flat + update).values()
        reply_arrays = ArrayRecord(
            array_dict={
                k: Array(np.ascontiguousarray(a)) for k, a in zip(global_arrays.keys(), new, strict=True)
            }
        )
        content = RecordDict({"arrays": reply_arrays})
        if extra:
            content["metrics"] = MetricRecord(extra)
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        _, data, trainer = load_for_run(_config(context))
        cid = _client_id(data, context)
        _, flat = _global(msg)
        _, n, loss_sum, correct = trainer.evaluate([cid], flat)[0]
        out = MetricRecord(
            {"num-examples": int(n), "loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1)}
        )
        return Message(RecordDict({"metrics": out}), reply_to=msg)

    @app.query("fedsim_identity")
    def identity(msg: Message, context: Context) -> Message:
        """Which training client this node holds (asked once by :class:`fedsim.flower.grid.ClientIdGrid`)."""
        _, data, _ = load_for_run(_config(context))
        cid = _client_id(data, context)
        rec = ConfigRecord({KEY_CLIENT_ID: cid, KEY_PARTITION_ID: int(context.node_config["partition-id"])})
        return Message(RecordDict({"identity": rec}), reply_to=msg)

    return app


app = make_client_app()
