"""The clients of one experiment (:class:`~fedsim.data.population.FederatedData`), and ``build_federated_data``
that makes them.

Two kinds share the interface (a third, ``shakespeare``, is in :mod:`fedsim.data.shakespeare`):

* ``ArrayFederatedData`` (digits, mnist1d): base arrays + one index array per client (from a
  flwr-datasets partitioner) + per-domain feature shifts.
* ``SyntheticFederatedData`` (synthetic): generator parameters only; each client's data is
  computed on demand from ``(seed, client id)``.

Both pickle small (no torch objects, no Hugging Face objects) so they can be shipped to Ray workers,
and both are fully determined by their arguments and ``seed``.

Domains are contiguous blocks of client ids (``domains=K`` equal blocks, or a list of fractions for
unequal blocks). Held-out clients are drawn with the seed, stratified by domain, and are never
trained on; every domain keeps at least one training client (:mod:`fedsim.data.population`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedsim.data import synthetic as syn
from fedsim.data._validate import check_bool, check_choice, check_float, check_int, invalid
from fedsim.data.base import (
    HUB_PREFIX,
    MNIST1D_DEFAULT_SAMPLES,
    ArrayDataset,
    load_digits_arrays,
    load_hub_arrays,
    make_mnist1d_arrays,
)
from fedsim.data.partition import PARTITIONER_OPTIONS, PARTITIONERS, cached_partition_rows
from fedsim.data.population import FederatedData, label_maps, relabel, size_stats, split_domains
from fedsim.data.shakespeare import build_shakespeare
from fedsim.data.user import arrays_from_result, call_data_function
from fedsim.factories import IGNORE_INDEX, describe, is_reference

DATASETS: tuple[str, ...] = ("digits", "mnist1d", "synthetic", "shakespeare")
"""The offline datasets (``shakespeare``: :mod:`fedsim.data.shakespeare`). ``"hf:<repo id>"`` also loads a Hugging
Face dataset (online or cached), and ``"package.module:function"`` (or a callable) a user's dataset
(:mod:`fedsim.data.user`)."""
USER = "package.module:function"

_TAG_SHIFT = 0x5411
_TAG_NOISE = 0x4015

_PARTITION_OPTION_NAMES = tuple(sorted({o for opts in PARTITIONER_OPTIONS.values() for o in opts}))
_DOMAIN_OPTIONS = ("domain_shift", "domain_noise", "domain_label_swaps")
DATASET_OPTIONS: dict[str, tuple[str, ...]] = {
    "digits": _PARTITION_OPTION_NAMES + _DOMAIN_OPTIONS,
    "mnist1d": ("num_samples", *_PARTITION_OPTION_NAMES, *_DOMAIN_OPTIONS),
    "synthetic": (
        "synthetic_alpha",
        "synthetic_beta",
        "synthetic_iid",
        "synthetic_dim",
        "synthetic_classes",
        "synthetic_min_samples",
        "synthetic_max_samples",
        "domain_label_swaps",
    ),
    "shakespeare": (
        "seq_len",
        "stride",
        "min_samples",
        "max_samples_per_client",
        "targets",
        "domain_label_swaps",
    ),
    HUB_PREFIX: ("hub_split", "hub_feature", "hub_label", *_PARTITION_OPTION_NAMES, *_DOMAIN_OPTIONS),
    USER: ("options", *_PARTITION_OPTION_NAMES, *_DOMAIN_OPTIONS),
}
"""Extra keyword options each dataset accepts (an option passed as ``None`` counts as not given)."""

DEFAULT_DOMAIN_SHIFT = 0.5
DEFAULT_DOMAIN_NOISE = 0.0


# --------------------------------------------------------------------------- array datasets
class ArrayFederatedData(FederatedData):
    """digits / mnist1d: shared base arrays and one index array per client."""

    def __init__(
        self,
        base: ArrayDataset,
        client_rows: list[np.ndarray],
        *,
        seed: int,
        heldout_fraction: float,
        domain_sizes: tuple[int, ...],
        domains_requested: bool,
        domain_shift: float,
        domain_noise: float,
        partition_settings: dict[str, Any],
        domain_label_swaps: int = 0,
        dataset_settings: dict[str, Any],
    ) -> None:
        super().__init__(
            dataset=base.name,
            num_clients=len(client_rows),
            seed=seed,
            heldout_fraction=heldout_fraction,
            domain_sizes=domain_sizes,
            domains_requested=domains_requested,
            input_shape=base.input_shape,
            num_classes=base.num_classes,
        )
        self.x = base.x
        self.y = base.y
        self.target_shape = tuple(int(v) for v in base.y.shape[1:])
        sizes = np.asarray([r.size for r in client_rows], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._rows = np.concatenate(client_rows).astype(np.int32 if base.x.shape[0] < 2**31 else np.int64)
        self.partition_settings = partition_settings
        self.dataset_settings = dataset_settings
        self.domain_shift = domain_shift
        self.domain_noise = domain_noise
        # Domain d's features: x + shift[d] (+ per-example noise of std noise_std[d] * feature std).
        # (Per feature, whatever the example's shape: images are shifted pixel by pixel.)
        k, shape = self.num_domains, base.input_shape
        std = base.x.std(axis=0).astype(np.float64)  # [*input_shape]
        self._shift = np.zeros((k, *shape), dtype=np.float32)
        for d in range(1, k):
            z = np.random.default_rng([seed, _TAG_SHIFT, d]).standard_normal(base.input_dim).reshape(shape)
            self._shift[d] = (domain_shift * std * z).astype(np.float32)
        levels = np.arange(k) / (k - 1) if k > 1 else np.zeros(1)
        self._noise_std = (domain_noise * levels.reshape(k, *([1] * len(shape))) * std[None]).astype(
            np.float32
        )
        self.domain_label_swaps = int(domain_label_swaps)
        self._label_maps = label_maps(seed, k, self.num_classes, self.domain_label_swaps)

    def client_rows(self, cid: int) -> np.ndarray:
        """Indices into the base arrays ``x``/``y`` of client ``cid``'s examples (read-only view)."""
        cid = self._check_cid(cid)
        out = self._rows[self._offsets[cid] : self._offsets[cid + 1]].view()
        out.setflags(write=False)
        return out

    def client_data(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.client_rows(cid)
        x = self.x[rows]
        d = self.domain(cid)
        if d > 0:
            x += self._shift[d]
            if self.domain_noise > 0:
                rng = np.random.default_rng([self.seed, _TAG_NOISE, int(cid)])
                x += (rng.standard_normal(x.shape) * self._noise_std[d]).astype(np.float32)
            if self.domain_label_swaps:
                return x, relabel(self._label_maps[d], self.y[rows])
        return x, self.y[rows]

    def num_examples_array(self, cids: Sequence[int] | np.ndarray) -> np.ndarray:
        cids = np.asarray(cids, dtype=np.int64)
        if cids.size and (cids.min() < 0 or cids.max() >= self.num_clients):
            raise invalid("cids", cids.tolist(), f"client ids in [0, {self.num_clients - 1}]")
        return (self._offsets[cids + 1] - self._offsets[cids]).astype(np.int64)

    def label_entropy(self, cid: int) -> float:
        """Entropy (nats) of client ``cid``'s label distribution; log(num_classes) is uniform."""
        y = self.y[self.client_rows(cid)].ravel()
        counts = np.bincount(y[y != IGNORE_INDEX], minlength=self.num_classes)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())

    def describe(self) -> dict[str, Any]:
        sizes = np.diff(self._offsets)
        entropy = np.array([self.label_entropy(c) for c in range(self.num_clients)])
        out = self._common_description()
        out.update(self.dataset_settings)
        out.update(
            {
                "num_examples": int(sizes.sum()),
                "examples_per_client": size_stats(sizes),
                "mean_client_label_entropy": float(entropy.mean()),
                "max_label_entropy": float(math.log(self.num_classes)),
                **self.partition_settings,
                "domain_shift": self.domain_shift if self.num_domains > 1 else None,
                "domain_noise": self.domain_noise if self.num_domains > 1 else None,
                "domain_label_swaps": self.domain_label_swaps if self.num_domains > 1 else None,
                "domain_label_maps": self._label_maps.tolist() if self.domain_label_swaps else None,
            }
        )
        return out


# --------------------------------------------------------------------------- synthetic
class SyntheticFederatedData(FederatedData):
    """Synthetic(alpha, beta): clients generated on demand from ``(seed, client id)``."""

    def __init__(
        self,
        *,
        num_clients: int,
        seed: int,
        heldout_fraction: float,
        domain_sizes: tuple[int, ...],
        domains_requested: bool,
        alpha: float,
        beta: float,
        iid: bool,
        dim: int,
        num_classes: int,
        min_samples: int,
        max_samples: int,
        domain_label_swaps: int = 0,
    ) -> None:
        super().__init__(
            dataset="synthetic",
            num_clients=num_clients,
            seed=seed,
            heldout_fraction=heldout_fraction,
            domain_sizes=domain_sizes,
            domains_requested=domains_requested,
            input_shape=(dim,),
            num_classes=num_classes,
        )
        self.alpha = alpha
        self.beta = beta
        self.iid = iid
        self.min_samples = min_samples
        self.max_samples = max_samples
        # one (u, B) draw per domain when domains are asked for; else every client draws its own
        self._domain_means = (
            tuple(syn.domain_means(seed, d, alpha, beta) for d in range(self.num_domains))
            if domains_requested
            else None
        )
        self.domain_label_swaps = int(domain_label_swaps)
        self._label_maps = label_maps(seed, self.num_domains, num_classes, self.domain_label_swaps)

    def client_data(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        cid = self._check_cid(cid)
        d = self.domain(cid)
        x, y = syn.generate_client(
            self.seed,
            cid,
            alpha=self.alpha,
            beta=self.beta,
            iid=self.iid,
            dim=self.input_dim,
            num_classes=self.num_classes,
            num_samples=self.num_examples(cid),
            shared_means=None if self._domain_means is None else self._domain_means[d],
        )
        return (x, self._label_maps[d][y]) if self.domain_label_swaps else (x, y)

    def num_examples_array(self, cids: Sequence[int] | np.ndarray) -> np.ndarray:
        cids = np.asarray(cids, dtype=np.int64)
        if cids.size and (cids.min() < 0 or cids.max() >= self.num_clients):
            raise invalid("cids", cids.tolist()[:10], f"client ids in [0, {self.num_clients - 1}]")
        return syn.synthetic_sizes(self.seed, cids, self.min_samples, self.max_samples)

    def describe(self) -> dict[str, Any]:
        out = self._common_description()
        # sizes of at most 100k clients (a uniform stride over the population) keep this cheap
        step = max(1, self.num_clients // 100_000)
        sizes = self.num_examples_array(np.arange(0, self.num_clients, step))
        out.update(
            {
                "partitioner": "natural",
                "synthetic_alpha": self.alpha,
                "synthetic_beta": self.beta,
                "synthetic_iid": self.iid,
                "synthetic_min_samples": self.min_samples,
                "synthetic_max_samples": self.max_samples,
                "examples_per_client": size_stats(sizes) | {"sampled_every": step},
                "domain_means": None if self._domain_means is None else [list(m) for m in self._domain_means],
                "domain_label_swaps": self.domain_label_swaps if self.num_domains > 1 else None,
                "domain_label_maps": self._label_maps.tolist() if self.domain_label_swaps else None,
            }
        )
        return out


# --------------------------------------------------------------------------- builder
def build_federated_data(
    dataset: str = "digits",
    num_clients: int = 100,
    partitioner: str = "iid",
    alpha: float = 0.5,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    domains: int | Sequence[float] | None = None,
    **dataset_options: Any,
) -> FederatedData:
    """Build the federated population of an experiment.

    Parameters
    ----------
    dataset : one of ``DATASETS``, ``"hf:<repo id>"`` for a Hugging Face dataset (needs the Hub or
        its local cache; offline it raises a ValueError that says so), or a user's data function as
        ``"package.module:function"`` or a callable (:mod:`fedsim.data.user`; its keyword arguments in
        the ``options`` mapping).
    num_clients : total number of clients, held-out ones included.
    partitioner : one of ``PARTITIONERS`` (ignored by ``synthetic``, which is naturally partitioned).
    alpha : Dirichlet concentration (``partitioner="dirichlet"`` only).
    heldout_fraction : fraction of clients in [0, 1) never trained on, drawn with ``seed`` per domain.
    seed : non-negative integer; everything (partition, held-out set, shifts, synthetic data) follows from it.
    domains : ``None`` (one domain), ``K`` (K equal blocks of client ids) or a list of fractions
        summing to 1 (unequal blocks).
    dataset_options : see ``DATASET_OPTIONS``; ``None`` values count as not given.
        digits/mnist1d: ``num_samples`` (mnist1d, default 4000), ``domain_shift`` (default 0.5),
        ``domain_noise`` (default 0.0), ``domain_label_swaps`` (default 0: pairs of classes whose labels
        are exchanged in every domain after the first, a concept shift), partitioner options ``min_partition_size``, ``self_balancing``
        (dirichlet), ``num_classes_per_partition``, ``class_assignment_mode`` (pathological),
        ``num_shards_per_partition``, ``shard_size``, ``keep_incomplete_shard`` (shard).
        ``"hf:<repo id>"``: ``hub_split`` ("train"), ``hub_feature``, ``hub_label`` (guessed from the
        column names) and the digits options.
        synthetic: ``synthetic_alpha``, ``synthetic_beta`` (default 1.0), ``synthetic_iid`` (False),
        ``synthetic_dim`` (60), ``synthetic_classes`` (10), ``synthetic_min_samples`` (50),
        ``synthetic_max_samples`` (1000).
        shakespeare (one client per role, :mod:`fedsim.data.shakespeare`): ``seq_len`` (80), ``stride`` (8),
        ``min_samples`` (32), ``max_samples_per_client`` (256), ``targets`` (``"next"``), ``domain_label_swaps``.
    """
    hub = isinstance(dataset, str) and dataset.startswith(HUB_PREFIX) and len(dataset) > len(HUB_PREFIX)
    user = (callable(dataset) and not isinstance(dataset, str)) or (not hub and is_reference(dataset))
    if not (hub or user):
        check_choice("dataset", dataset, (*DATASETS, f"{HUB_PREFIX}<repo id>", USER))
    kind = HUB_PREFIX if hub else USER if user else dataset
    options = {k: v for k, v in dataset_options.items() if v is not None}
    for name, value in options.items():
        if name not in DATASET_OPTIONS[kind]:
            takes = ", ".join(DATASET_OPTIONS[kind])
            raise invalid(name, value, f"no value: dataset={dataset!r} takes {takes}")
    num_clients = check_int("num_clients", num_clients, minimum=1)
    heldout_fraction = check_float("heldout_fraction", heldout_fraction, low=0.0, high=1.0, high_open=True)
    seed = check_int("seed", seed, minimum=0)
    sizes, requested = split_domains(num_clients, domains)
    if dataset == "shakespeare":  # natural clients, one per role: no partitioner
        return build_shakespeare(num_clients, heldout_fraction, seed, domains, **options)
    if dataset != "synthetic":
        check_choice("partitioner", partitioner, PARTITIONERS)

    given_rows = None
    if user:
        fn_options = options.get("options", {})
        if not isinstance(fn_options, dict):
            raise invalid("options", fn_options, "a table of keyword arguments for the data function")
        result = call_data_function(dataset, num_clients, seed, fn_options)
        if isinstance(result, FederatedData):
            if result.num_clients != num_clients:
                raise invalid(
                    "num_clients",
                    num_clients,
                    f"{result.num_clients}: the FederatedData {describe(dataset)!r} returned",
                )
            return result
        base, given_rows = arrays_from_result(result, describe(dataset), num_clients)

    if dataset == "synthetic":
        lo = check_int("synthetic_min_samples", options.get("synthetic_min_samples", 50), minimum=1)
        hi = check_int("synthetic_max_samples", options.get("synthetic_max_samples", 1000), minimum=lo)
        return SyntheticFederatedData(
            num_clients=num_clients,
            seed=seed,
            heldout_fraction=heldout_fraction,
            domain_sizes=sizes,
            domains_requested=requested,
            alpha=check_float("synthetic_alpha", options.get("synthetic_alpha", 1.0), low=0.0),
            beta=check_float("synthetic_beta", options.get("synthetic_beta", 1.0), low=0.0),
            iid=check_bool("synthetic_iid", options.get("synthetic_iid", False)),
            dim=check_int("synthetic_dim", options.get("synthetic_dim", 60), minimum=1),
            num_classes=check_int("synthetic_classes", options.get("synthetic_classes", 10), minimum=2),
            min_samples=lo,
            max_samples=hi,
            domain_label_swaps=check_int(
                "domain_label_swaps", options.get("domain_label_swaps", 0), minimum=0
            ),
        )

    dataset_settings: dict[str, Any] = {}
    if user:
        dataset_settings = {"data_function": describe(dataset), "num_examples_given": len(base)}
    elif hub:
        split = options.get("hub_split", "train")
        repo = dataset[len(HUB_PREFIX) :]
        base = load_hub_arrays(repo, split, options.get("hub_feature"), options.get("hub_label"))
        dataset_settings = {"hub_split": split}
    elif dataset == "digits":
        base = load_digits_arrays()
    else:
        n = check_int("num_samples", options.get("num_samples", MNIST1D_DEFAULT_SAMPLES), minimum=10)
        base = make_mnist1d_arrays(n)
        dataset_settings = {"num_samples": len(base)}
    shift = check_float("domain_shift", options.get("domain_shift", DEFAULT_DOMAIN_SHIFT), low=0.0)
    noise = check_float("domain_noise", options.get("domain_noise", DEFAULT_DOMAIN_NOISE), low=0.0)
    swaps = check_int("domain_label_swaps", options.get("domain_label_swaps", 0), minimum=0)
    part_opts = {k: v for k, v in options.items() if k in _PARTITION_OPTION_NAMES}
    if given_rows is not None:  # the user's own clients
        rows, settings = given_rows, {"partitioner": "given by the data function"}
    else:
        rows, settings = cached_partition_rows(
            base.y, num_clients, partitioner, seed=seed, alpha=alpha, **part_opts
        )
    return ArrayFederatedData(
        base,
        rows,
        seed=seed,
        heldout_fraction=heldout_fraction,
        domain_sizes=sizes,
        domains_requested=requested,
        domain_shift=shift,
        domain_noise=noise,
        domain_label_swaps=swaps,
        partition_settings=settings,
        dataset_settings=dataset_settings,
    )
