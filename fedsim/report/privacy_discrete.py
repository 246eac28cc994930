"""``fedsim privacy`` for a mechanism whose clients encode for secure aggregation (``ddgauss``, ``skellam``): epsilon
per round of the discrete mechanism beside the continuous Gaussian's at the same noise, and a table over the modulus'
bits of what quantisation costs (the scale, the sensitivity's inflation by rounding, tau, epsilon), so that bits can be
picked before deploying.

The numbers are the ledger's own: each round is the mechanism's release kind (:mod:`fedsim.privacy.discrete`) for the
model size given (``--model-size``: the rotation pads it to a power of two), composed in Renyi DP by the ``rdp``
accountant, each with the noise of the fewest shares a released round holds (``min_shares`` of the expected cohort).
The Gaussian columns are continuous Gaussian noise of that same std: what quantising costs on top.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from fedsim.privacy.accountants import compute_curve
from fedsim.privacy.discrete import RDP_ORDERS, ddgauss_rdp, epsilon_from_rdp
from fedsim.privacy.errors import PrivacyInputError
from fedsim.report.rundir import json_safe

#: the bits the table compares (the issue's range: from what 100 clients need to beyond float32's 22)
TABLE_BITS = tuple(range(8, 21))


def noise_options(noise: Any) -> dict[str, Any]:
    """The mechanism's options as built (its dataclass fields beyond the seed)."""
    from fedsim.round.noise import mechanism_options

    return {k: getattr(noise, k) for k in mechanism_options(noise.name)}


def _with_bits(noise: Any, bits: int, size: int) -> Any:
    other = type(noise)(noise.seed, **{**noise_options(noise), "bits": bits})
    other.set_model_size(size)
    return other


def _epsilons(release: Any, rounds: list[int], delta: float) -> list[float]:
    per = release.rdp(RDP_ORDERS)
    return [float(epsilon_from_rdp(RDP_ORDERS, t * per, delta)[0]) for t in rounds]


def gaussian_same_bound(mech: Any, T: int, delta: float) -> float:
    """Epsilon after ``T`` rounds of continuous Gaussian noise of the same std, amplified by the same generic bound as
    the discrete mechanisms (Zhu and Wang's, at the same integer orders): what quantisation alone costs is the gap
    between this and the discrete epsilon; the gap between this and dp-accounting's exact analysis of the
    Poisson-subsampled Gaussian is the price of the generic amplification bound."""
    z = float(mech.noise_multiplier)
    per = ddgauss_rdp(RDP_ORDERS, float(mech.q), 1.0 / z, 0.0, 0.0, 1)
    return float(epsilon_from_rdp(RDP_ORDERS, T * per, delta)[0])


def bits_table(
    noise: Any, mech: Any, size: int, T: int, delta: float, gaussian_eps: float, gauss_mech: Any
) -> list[dict[str, Any]]:
    """One row per bits in :data:`TABLE_BITS` (and the mechanism's own): the scale ``1/gamma``, the grid step, the
    rounding's inflation of the L2 sensitivity (``Delta_2 gamma / c``), tau (DDGauss; 0 for Skellam), epsilon after
    ``T`` rounds and the continuous Gaussian's; bits that cannot hold the cohort give the bits needed instead."""
    rows = []
    same = gaussian_same_bound(gauss_mech, T, delta)
    for bits in sorted({*TABLE_BITS, int(noise.bits)}):
        row: dict[str, Any] = {"bits": bits, "gaussian_epsilon": gaussian_eps, "gaussian_same_bound": same}
        try:
            r = _with_bits(noise, bits, size).dp_release(1, mech)
        except (ValueError, PrivacyInputError) as exc:
            row["refused"] = str(getattr(exc, "allowed", exc))
            rows.append(row)
            continue
        row.update(
            scale=1.0 / r.gamma,
            grid_step=r.gamma,
            inflation=r.l2_sensitivity * r.gamma / r.clip,
            tau=float(getattr(r, "tau", 0.0)),
            epsilon=_epsilons(r, [T], delta)[0],
        )
        rows.append(row)
    return rows


def run_discrete(args: Any, settings: Any, checkpoints: list[int]) -> int:
    """``fedsim privacy`` for an encoding mechanism (see the module's docstring); 0, or 2 for bad input."""
    size = getattr(args, "model_size", None)
    if size is None or size < 1:
        raise PrivacyInputError(
            "model_size",
            size,
            f"is required for mechanism={settings.mechanism!r}: its rotation pads the model's update to a power of "
            "two and its accounting depends on that dimension (give the number of parameters)",
        )
    T, delta = int(args.rounds), float(args.delta)
    mech = settings.mechanism_at(args.population)
    noise = settings.noise_source(0)
    noise.set_model_size(int(size))
    release = noise.dp_release(1, mech)  # refuses bits that cannot hold the cohort, naming the bits needed
    discrete = _epsilons(release, checkpoints, delta)
    # continuous Gaussian noise of the std the discrete rounds are accounted with (the floor's shares)
    accounted_z = mech.noise_multiplier * math.sqrt(release.shares / mech.expected_cohort)
    gauss_mech = mech.replace(noise_kind="gaussian", noise_multiplier=accounted_z)
    gauss = compute_curve(gauss_mech, T, delta, "rdp", exact_at=tuple(checkpoints))
    gaussian = [float(gauss.epsilon[t - 1]) for t in checkpoints]
    table = bits_table(noise, mech, int(size), T, delta, gaussian[-1], gauss_mech)
    if args.json:
        doc = {
            "mechanism": {
                "name": noise.name,
                "options": noise_options(noise),
                "model_size": int(size),
                "padded_dim": release.dim,
                "q": mech.q,
                "expected_cohort": mech.expected_cohort,
                "clip": mech.clip,
                "noise_multiplier": mech.noise_multiplier,
                "release": release.to_dict(),
            },
            "rounds": T,
            "delta": delta,
            "accountant": "rdp",
            "per_round": {"round": checkpoints, "epsilon": discrete, "gaussian_epsilon": gaussian},
            "bits_table": table,
        }
        json.dump(json_safe(doc), sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    print(_human(noise, mech, release, int(size), checkpoints, discrete, gaussian, table, delta))
    return 0


def _num(x: Any, fmt: str = ".4g") -> str:
    return "inf" if isinstance(x, float) and not math.isfinite(x) else format(x, fmt)


def _human(noise, mech, release, size, checkpoints, discrete, gaussian, table, delta) -> str:
    lines = [
        f"mechanism: {noise.describe()}",
        f"  {noise.name} over a model of {size} numbers (padded to {release.dim}); clip {mech.clip:g}, noise "
        f"multiplier {mech.noise_multiplier:g} over an expected cohort of {mech.expected_cohort:g} (q={mech.q:.4g}); "
        f"grid step gamma {release.gamma:.4g}, L2 sensitivity after rounding {release.l2_sensitivity * release.gamma:.6g}"
        f" (clip {mech.clip:g}); each client's noise std {release.local_std_grid:.4g} grid steps",
        f"each round accounted with the noise of {release.shares:g} shares (min_shares {noise.min_shares:g} of the "
        f"expected cohort: a round with fewer is not released); gaussian: continuous noise of that std",
        f"certified epsilon at delta {delta:g} (rdp):",
        f"{'round':>8}  {noise.name + ' eps':>14}  {'gaussian eps':>14}",
    ]
    for t, e, g in zip(checkpoints, discrete, gaussian, strict=True):
        lines.append(f"{t:>8}  {_num(e):>14}  {_num(g):>14}")
    lines.append(
        f"bits, after {checkpoints[-1]} rounds. gaussian: continuous noise of the same std, unquantised (exact: "
        "dp-accounting's Poisson-subsampled Gaussian; same bound: the generic subsampling bound the discrete "
        "mechanisms are accounted with, so the gap to it is what quantisation costs):"
    )
    lines.append(
        f"{'bits':>5}  {'scale 1/gamma':>13}  {'L2 inflation':>12}  {'tau':>9}  {'epsilon':>9}  "
        f"{'gauss same':>10}  {'gauss exact':>11}"
    )
    for row in table:
        if "refused" in row:
            lines.append(f"{row['bits']:>5}  refused: {row['refused']}")
            continue
        lines.append(
            f"{row['bits']:>5}  {row['scale']:>13.4g}  {row['inflation']:>12.6g}  {row['tau']:>9.2g}  "
            f"{_num(row['epsilon']):>9}  {_num(row['gaussian_same_bound']):>10}  "
            f"{_num(row['gaussian_epsilon']):>11}"
        )
    return "\n".join(lines)


__all__ = ["TABLE_BITS", "bits_table", "run_discrete"]
