"""Synthetic(alpha, beta): the FedProx / LEAF generator, evaluated lazily per client.

Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020), section 5.1, and the
reference generator in LEAF (``data/synthetic``) and FedProx (``data/synthetic_*``):

* client model: ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` of shape [d, C], ``b_k ~ N(u_k, 1)`` of shape [C]
* client features: ``B_k ~ N(0, beta)``, ``v_k[j] ~ N(B_k, 1)``, ``x ~ N(v_k, Sigma)``,
  ``Sigma = diag(j ** -1.2)`` for j = 1..d
* label: ``y = argmax(softmax(x W_k + b_k))``
* size: ``n_k = min(max_samples, min_samples + floor(LogNormal(4, 2)))`` (LEAF: ``lognormal(4, 2) + 50``)

As in the reference code, ``alpha`` and ``beta`` are used as the *scale* (standard deviation) of
the normal draws. ``iid=True`` gives the paper's Synthetic-IID: one shared ``W, b ~ N(0, 1)`` and
``v = 0`` for everybody.

Nothing is stored per client: client ``k``'s data is a pure function of ``(seed, k)`` (and of the
domain's shared draw when domains are used), so a population of millions costs nothing until a
client is read, and reading the same client twice gives identical arrays. Client sizes come from a
counter-based hash so that they can be computed for many clients at once without generating data.
"""

from __future__ import annotations

import numpy as np

# Stream tags: independent random streams derived from the one user seed.
_TAG_CLIENT = 0x5EED_0001
_TAG_SIZE = 0x5EED_0002
_TAG_DOMAIN = 0x5EED_0003
_TAG_GLOBAL = 0x5EED_0004

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, vectorised over uint64 arrays (wrap-around intended)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _uniforms(seed: int, tag: int, cids: np.ndarray, stream: int) -> np.ndarray:
    """Deterministic uniforms in [0, 1) for each client id (counter-based, vectorised)."""
    key = splitmix64(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    key = splitmix64(key ^ np.uint64(tag))
    with np.errstate(over="ignore"):
        ctr = cids.astype(np.uint64) * np.uint64(2) + np.uint64(stream)
        h = splitmix64(splitmix64(key ^ ctr))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def synthetic_sizes(seed: int, cids: np.ndarray, min_samples: int, max_samples: int) -> np.ndarray:
    """Client sizes ``min(max, min + floor(LogNormal(4, 2)))`` for many clients at once (int64)."""
    cids = np.asarray(cids, dtype=np.int64).reshape(-1)
    u1 = 1.0 - _uniforms(seed, _TAG_SIZE, cids, 0)  # (0, 1]
    u2 = _uniforms(seed, _TAG_SIZE, cids, 1)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller
    extra = np.floor(np.exp(np.minimum(4.0 + 2.0 * z, 40.0)))
    return np.minimum(float(max_samples), min_samples + extra).astype(np.int64)


def feature_scales(dim: int) -> np.ndarray:
    """Standard deviations of the feature covariance ``Sigma = diag(j ** -1.2)``."""
    return np.sqrt(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)


def domain_means(seed: int, domain: int, alpha: float, beta: float) -> tuple[float, float]:
    """The draw ``(u, B)`` shared by every client of a domain."""
    rng = np.random.default_rng([seed, _TAG_DOMAIN, domain])
    return float(rng.normal(0.0, alpha)), float(rng.normal(0.0, beta))


def generate_client(
    seed: int,
    cid: int,
    *,
    alpha: float,
    beta: float,
    iid: bool,
    dim: int,
    num_classes: int,
    num_samples: int,
    shared_means: tuple[float, float] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Client ``cid``'s data, a pure function of its arguments: ``x`` float32 [n, dim], ``y`` int64 [n]."""
    rng = np.random.default_rng([seed, _TAG_CLIENT, cid])
    if iid:
        g = np.random.default_rng([seed, _TAG_GLOBAL])
        w = g.normal(0.0, 1.0, (dim, num_classes))
        b = g.normal(0.0, 1.0, num_classes)
        v = np.zeros(dim)
    else:
        if shared_means is None:
            u, big_b = rng.normal(0.0, alpha), rng.normal(0.0, beta)
        else:
            u, big_b = shared_means
        w = rng.normal(u, 1.0, (dim, num_classes))
        b = rng.normal(u, 1.0, num_classes)
        v = rng.normal(big_b, 1.0, dim)
    x = v + rng.standard_normal((num_samples, dim)) * feature_scales(dim)
    y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
    return x.astype(np.float32), y.astype(np.int64)
