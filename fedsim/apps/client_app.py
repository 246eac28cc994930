"""The fedsim ClientApp: one node = one training client of the scenario.

It trains with the same :class:`~fedsim.training.trainer.ClientTrainer` as the Ray engine. A node configured for
distributed noise (:class:`NoisePolicy`) clips its update and adds its own noise share before the update leaves
the node, with its own floor on the noise: it never takes the server's word for how much is enough. Nothing
happens at import time.

Node config (set by whoever runs the SuperNode, ``--node-config "partition-id=3 noise-multiplier=1.0 ..."``):

====================  ===================================================================================
key                   meaning
====================  ===================================================================================
``partition-id``      which training client of the scenario this node is
``noise-multiplier``  this node adds distributed noise with at least this noise multiplier, whatever the
                      run config says (without it: the run config's scenario decides, see :class:`NoisePolicy`)
``clip``              the largest clip this node accepts (default: the scenario's clip; any clip with
                      adaptive clipping, whose clip moves: the noise is relative to the clip either way)
``noise-shares``      the largest number of shares the noise may be split into (default: the scenario's
                      expected cohort): the node's share is at least ``z * clip / sqrt(noise-shares)``
``count-noise-multiplier``  adaptive clipping: the floor on the noise of the node's unclipped bit
``noise-mechanism``   with ``noise-multiplier`` set: the mechanism this node draws its shares with and whose share
                      rule gives its floor (default ``independent``, Gaussian); a run config naming another is refused
``allow-evaluate``    ``true``: answer evaluate messages (exact example count, loss and accuracy of this
                      client: not covered by epsilon). A node with distributed noise refuses them otherwise
``secure-aggregation``  ``true``: this node sends its encoded update only masked by SecAgg+ (a train message
                      without a secure-aggregation session is refused); ``false``: it also answers a server that
                      does not ask for it. Default: the run config's scenario (``privacy.secagg.enabled``)
====================  ===================================================================================

A node whose run config and node config ask for no distributed noise sends its raw update (central noise: the
server is trusted to clip and noise it, as the threat model of central DP says).

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

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim.experiment import build_strategy, privacy_settings, public_population
from fedsim.flower.grid import KEY_CLIENT_ID, KEY_PARTITION_ID
from fedsim.flower.protocol import (
    CFG_CLIP,
    CFG_COUNT_NOISE_STD,
    CFG_LOSS_BOUND,
    CFG_NOISE_STD,
    CFG_ROUND,
    MET_LOSS,
    MET_UNCLIPPED_NOISED,
    encoded_reply,
    encoding_of,
)
from fedsim.round import NoiseSource, flatten, make_noise_source, placement
from fedsim.round.discrete import MAX_SCALED
from fedsim.secagg.protocol import QUERY as SECAGG_QUERY
from fedsim.secagg.protocol import SESSION, check_train, handle_query, mask_input, masked_reply
from fedsim.training.evaluation import client_means
from fedsim.training.trainer import ClientPlan

from .run_config import load_for_run, model_arrays

#: node-config keys of :class:`NoisePolicy` (see the module docstring)
NODE_NOISE_MULTIPLIER = "noise-multiplier"
NODE_CLIP = "clip"
NODE_SHARES = "noise-shares"
NODE_COUNT_NOISE_MULTIPLIER = "count-noise-multiplier"
NODE_ALLOW_EVALUATE = "allow-evaluate"
NODE_MECHANISM = "noise-mechanism"
NODE_SECAGG = "secure-aggregation"
#: relative slack for comparing the server's floats with the node's floor (float32/float64 round trips)
_SLACK = 1e-9


class NoiseRefused(ValueError):
    """A message asks this node for less noise than it is configured to add (or for its raw update)."""


@dataclass(frozen=True)
class NoisePolicy:
    """What a node requires before any update leaves it.

    ``distributed``: the node clips and noises its own update, with the scenario's noise mechanism (``noise``,
    whose draw and share rule it uses: :meth:`fedsim.round.NoiseSource.share_scale`); ``noise_multiplier``,
    ``clip`` (the largest clip it accepts; ``inf``: any) and ``shares`` (the largest number of shares the noise may
    be split into) give its floor on the share, the mechanism's share of noise ``noise_multiplier * clip`` split in
    ``shares`` (Gaussian noise: ``noise_multiplier * clip / sqrt(shares)``) for the clip the message asks for;
    ``count_noise_multiplier``: the same for the unclipped bit of adaptive clipping; ``source``: where the policy
    came from (``node config`` or ``run config``), for the messages.
    """

    distributed: bool
    noise: NoiseSource | None = None
    noise_multiplier: float = 0.0
    clip: float = math.inf
    shares: float = 1.0
    count_noise_multiplier: float = 0.0
    allow_evaluate: bool = True
    source: str = "run config"
    secagg: bool = False
    secagg_source: str = "run config"

    @classmethod
    def for_node(
        cls, scenario: Any, data: Any, node_config: dict[str, Any], noise_seed: int | None = None
    ) -> NoisePolicy:
        """The node config's keys where set, else the run config's scenario (the expected cohort and the count
        noise by the strategy's own rules). A node that does not trust the run config sets all of them.
        ``noise_seed``: the node's own (its code's, never a message's; None: the operating system's entropy)."""
        p = scenario.privacy
        node = {k: v for k, v in node_config.items() if k in _NODE_KEYS}
        settings = privacy_settings(scenario)
        distributed = NODE_NOISE_MULTIPLIER in node or placement(settings.noise_placement).clients_add_noise
        secagg = _flag(node, NODE_SECAGG, settings.secagg is not None)
        if secagg and not distributed:
            raise NoiseRefused(
                f"this node sends its update only masked by secure aggregation ({NODE_SECAGG}=true in its node "
                f"config); the run config asks for noise_placement={settings.noise_placement!r}: its raw update "
                "would leave it"
            )
        if not distributed:
            return cls(False, allow_evaluate=True, source="run config")
        population = public_population(scenario, data)  # the server's: the same denominator and shares
        strategy = build_strategy(scenario, population=population, data=data)
        model = strategy.mechanism(population)
        count_z = strategy._count_noise_multiplier(model) if p.adaptive_clip else 0.0
        return cls(
            distributed=True,
            noise=_node_noise(settings, node, noise_seed),
            noise_multiplier=_positive(node, NODE_NOISE_MULTIPLIER, p.noise_multiplier),
            clip=_positive(node, NODE_CLIP, math.inf if p.adaptive_clip else p.clip),
            shares=_positive(node, NODE_SHARES, model.expected_cohort),
            count_noise_multiplier=_positive(node, NODE_COUNT_NOISE_MULTIPLIER, count_z, zero_ok=True),
            allow_evaluate=str(node.get(NODE_ALLOW_EVALUATE, "false")).strip().lower()
            in ("1", "true", "yes"),
            source="node config" if NODE_NOISE_MULTIPLIER in node else "run config",
            secagg=secagg,
            secagg_source="node config" if NODE_SECAGG in node else "run config",
        )

    def floor(self, clip: float) -> float:
        """The smallest share this node adds for ``clip``, by its noise mechanism's share rule."""
        assert self.noise is not None
        return self.noise.share_scale(self.noise_multiplier * clip, self.shares)

    def check(self, config: Any) -> tuple[float, float, float]:
        """``(clip, share std, count share std)`` to train with, from a train message's ``config``; raises
        :class:`NoiseRefused` for a message that asks for the raw update, a larger clip or less noise than this
        node's floor. The message's values are used when they are at least as private as the floor."""
        why = f"this node adds its own noise (distributed, from its {self.source})"
        share = _number(config.get(CFG_NOISE_STD))
        if share is None or share <= 0:
            raise NoiseRefused(
                f"{why}, and the message asks for no noise share: it never sends an un-noised update"
            )
        clip = _number(config.get(CFG_CLIP))
        if clip is None or clip <= 0:
            raise NoiseRefused(f"{why}; the message's clip {config.get(CFG_CLIP)!r} is not a positive number")
        if clip > self.clip * (1 + _SLACK):
            raise NoiseRefused(f"{why}; the message asks for clip {clip:g}, above this node's {self.clip:g}")
        need = self.floor(clip)
        if share < need * (1 - _SLACK):
            raise NoiseRefused(
                f"{why}; the message asks for a noise share of std {share:.4g} at clip {clip:g}, below this node's "
                f"floor {need:.4g} (noise multiplier {self.noise_multiplier:g} over at most {self.shares:g} shares)"
            )
        count = max(_number(config.get(CFG_COUNT_NOISE_STD, 0.0)) or 0.0, 0.0)  # 0: no bit is sent
        assert self.noise is not None
        count_need = self.noise.share_scale(self.count_noise_multiplier, self.shares)  # the server's rule too
        if 0 < count < count_need * (1 - _SLACK):
            raise NoiseRefused(
                f"{why}; the message asks for a noise share of std {count:.4g} on the unclipped bit, below this "
                f"node's floor {count_need:.4g}"
            )
        return clip, share, count

    def check_encoding(self, config: Any, clip: float, size: int) -> dict[str, Any] | None:
        """The public encoding a train message asks for (a mechanism whose clients encode), checked against what
        this node's own mechanism would use for a model of ``size`` numbers at ``clip``: the same kind, padded
        dimension and conditional rounding (``beta``), a noise std per client (``local_std_grid / scale``, in the
        update's units) at least this node's floor, and a grid at least as fine as the node's own for that noise
        (a coarse grid would inflate the sensitivity past what the node's mechanism accounts, and a grid coarser than
        the noise would send the rounded update almost un-noised). None where the node's mechanism does not encode;
        a message without an encoding for such a node is refused (it would ask for the float update)."""
        assert self.noise is not None
        encoding = encoding_of(config)
        if not self.noise.encodes:
            if encoding is not None:
                raise NoiseRefused(
                    f"the message asks for a {encoding.get('kind')!r} encoding; this node adds {self.noise.name!r} "
                    "noise, which is not encoded"
                )
            return None
        why = f"this node encodes its update with {self.noise.name!r} noise (from its {self.source})"
        if encoding is None or encoding.get("kind") != self.noise.name:
            got = None if encoding is None else encoding.get("kind")
            raise NoiseRefused(f"{why}; the message asks for encoding {got!r}")
        try:
            scale, beta = float(encoding["scale"]), float(encoding["beta"])
            std = float(encoding["local_std_grid"]) / scale
            int(encoding["rotation_seed"]), int(encoding["bits"])
            dim = int(encoding["dim"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise NoiseRefused(f"{why}; the message's encoding {sorted(encoding)} is incomplete") from None
        need = self.floor(clip)
        if not (math.isfinite(std) and std >= need * (1 - _SLACK)):
            raise NoiseRefused(
                f"{why}; the message's encoding adds noise of std {std:.4g} per client at clip {clip:g}, below this "
                f"node's floor {need:.4g}"
            )
        release = SimpleNamespace(
            expected_cohort=self.shares, clip=clip, noise_std=std * math.sqrt(self.shares), private=True
        )
        try:
            own = self.noise.encoding(release, size)
        except (
            ValueError
        ) as exc:  # bits that cannot hold the cohort, a scale beyond float64: the node's own rule
            raise NoiseRefused(f"{why}; {exc}") from None
        if dim != own["dim"] or abs(beta - own["beta"]) > 1e-12:
            raise NoiseRefused(
                f"{why}; the message's encoding (dimension {dim}, beta {beta:g}) is not this node's (dimension "
                f"{own['dim']}, beta {own['beta']:g})"
            )
        if not (math.isfinite(scale) and own["scale"] * (1 - _SLACK) <= scale and clip * scale <= MAX_SCALED):
            raise NoiseRefused(
                f"{why}; the message's grid step {1 / scale:.4g} is coarser than this node's {1 / own['scale']:.4g} "
                "for that noise (or finer than float64 holds)"
            )
        return encoding


_NODE_KEYS = (
    NODE_NOISE_MULTIPLIER,
    NODE_CLIP,
    NODE_SHARES,
    NODE_COUNT_NOISE_MULTIPLIER,
    NODE_ALLOW_EVALUATE,
    NODE_MECHANISM,
    NODE_SECAGG,
)


def _flag(node: dict[str, Any], key: str, default: bool) -> bool:
    if key not in node:
        return default
    value = str(node[key]).strip().lower()
    if value not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(f"node config {key}={node[key]!r}: must be true or false")
    return value in ("1", "true", "yes")


def _node_noise(settings: Any, node: dict[str, Any], noise_seed: int | None) -> NoiseSource:
    """The mechanism this node draws its shares with, and whose share rule gives its floor: the run config's, unless
    the node keeps its own policy (``noise-multiplier`` in its node config). Such a node takes the mechanism from its
    own config (``noise-mechanism``, default ``independent``: Gaussian shares) and refuses a run config that names
    another: a server could otherwise lower the node's floor by naming a mechanism whose shares split less noise
    per client."""
    if NODE_NOISE_MULTIPLIER not in node:
        return settings.noise_source(noise_seed).for_clients()
    own = str(node.get(NODE_MECHANISM, "independent")).strip()
    if own != settings.mechanism:
        raise NoiseRefused(
            f"this node adds {own!r} noise (its node config); the run config names mechanism {settings.mechanism!r}. "
            f"Set {NODE_MECHANISM}={settings.mechanism} in the node config to accept it"
        )
    return make_noise_source(own, noise_seed).for_clients()


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _positive(node: dict[str, Any], key: str, default: float, zero_ok: bool = False) -> float:
    if key not in node:
        return float(default)
    v = _number(node[key])
    if v is None or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"node config {key}={node[key]!r}: must be a positive number")
    return v


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

    def _policy(context: Context) -> tuple[Any, Any, NoisePolicy]:
        scenario, data, trainer = load_for_run(_config(context))
        # the noise shares come from the scenario's mechanism, seeded by the node's own code (never a message)
        return data, trainer, NoisePolicy.for_node(scenario, data, dict(context.node_config), noise_seed)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        data, trainer, policy = _policy(context)
        cid = _client_id(data, context)
        config = next(iter(msg.content.config_records.values()))
        server_round = int(config.get(CFG_ROUND, 0))
        global_arrays, flat = _global(msg)
        loss_bound = config.get(CFG_LOSS_BOUND)
        extra: dict[str, float] = {}
        if policy.distributed:
            # distributed noise: the trainer clips and adds this client's share before the update leaves it, at
            # least as much as this node's own floor (a message asking for less is refused: an error reply)
            clip, share_std, count_share = policy.check(config)
            encoding = policy.check_encoding(config, clip, flat.size)
            plan = ClientPlan(
                server_round, [cid], clip, share_std, count_share, noise=policy.noise, encoding=encoding
            )
            secure = SESSION in config
            if secure and encoding is None:
                raise NoiseRefused(
                    "the message asks for secure aggregation of an update this node does not encode"
                )
            if policy.secagg and not secure:
                raise NoiseRefused(
                    "this node sends its update only masked by secure aggregation (its "
                    f"{policy.secagg_source}); the message has no secure-aggregation session"
                )
            # before training: a message this node would not mask is refused without touching its data
            if secure:
                check_train(config, context, server_round)
            try:
                partial, metrics = trainer.train(plan, flat)
            except Exception:  # the encoding failed: a fixed text, since an error's text reaches the server
                if encoding is None:
                    raise
                raise ValueError(f"client {cid}: encoding its update failed") from None
            if partial.rejected:  # an error reply: the server counts it and tops up this client's noise share
                why = metrics[0].get("error", "a non-finite update") if metrics else "no update"
                raise ValueError(f"client {cid}: local training failed ({why})")
            if secure:  # SecAgg+: the encoding under this client's masks, uniform modulo 2^bits
                masked = mask_input(
                    config, context, cid, partial.extras["encoded"], int(encoding["bits"]), server_round
                )
                return Message(RecordDict({"arrays": masked_reply(masked)}), reply_to=msg)
            if encoding is not None:  # integers modulo 2^bits, what a secure sum adds: nothing else leaves
                return Message(RecordDict({"arrays": encoded_reply(partial.extras["encoded"])}), reply_to=msg)
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
        data, trainer, policy = _policy(context)
        if not policy.allow_evaluate:
            raise NoiseRefused(
                f"this node adds its own noise (distributed, from its {policy.source}) and does not answer "
                "evaluate messages, whose exact example count, loss and accuracy epsilon does not cover; start the "
                f"SuperNode with --node-config '{NODE_ALLOW_EVALUATE}=true' to allow them"
            )
        cid = _client_id(data, context)
        _, flat = _global(msg)
        means = client_means(trainer.evaluate([cid], flat))  # this client's loss, accuracy, ...
        means.pop("clients")
        out = MetricRecord({"num-examples": int(data.num_examples_array([cid])[0])})
        out.update({k: v for k, v in means.items() if math.isfinite(v)})
        return Message(RecordDict({"metrics": out}), reply_to=msg)

    @app.query(SECAGG_QUERY)
    def secure_aggregation(msg: Message, context: Context) -> Message:
        """A SecAgg+ stage other than the masked input (:mod:`fedsim.secagg.protocol`): key setup, key sharing,
        unmasking. Only a node that encodes its noised update takes part."""
        data, _, policy = _policy(context)
        if not (policy.distributed and policy.noise is not None and policy.noise.encodes):
            raise NoiseRefused(
                "secure aggregation: this node does not encode its update (no ddgauss/skellam noise)"
            )
        cid = _client_id(data, context)
        config = next(iter(msg.content.config_records.values()))
        return Message(RecordDict({"secagg": handle_query(config, context, cid)}), reply_to=msg)

    @app.query("fedsim_identity")
    def identity(msg: Message, context: Context) -> Message:
        """Which training client this node holds (asked once by :class:`fedsim.flower.grid.ClientIdGrid`)."""
        _, data, _ = load_for_run(_config(context))
        cid = _client_id(data, context)
        rec = ConfigRecord({KEY_CLIENT_ID: cid, KEY_PARTITION_ID: int(context.node_config["partition-id"])})
        return Message(RecordDict({"identity": rec}), reply_to=msg)

    return app


app = make_client_app()
