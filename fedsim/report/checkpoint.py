"""A run's checkpoint: everything needed to continue it exactly, in one file written atomically.

``checkpoint.npz`` in the run directory holds the model after round ``t``, the strategy's state (sampler and
noise-source state, the clip, the server optimizer's moments, the ledger, agnostic FL's lambda) and the number
of rows written, with a digest of the run's ``config.toml``. It is written to a temporary file, flushed to disk
and renamed over the previous one, so a run killed at any moment leaves the previous checkpoint whole.

No pickle: arrays are plain ``.npy`` members (``allow_pickle=False``) and the rest is JSON, so a checkpoint
from elsewhere cannot run code when it is read.

A run extended to more rounds (``fedsim run --resume RUN_DIR --set rounds=M``) gets a new ``config.toml``; its
checkpoint is first made valid for the new config as well as the old one (:func:`retarget_checkpoint`: the number
of rounds is the only difference, and nothing in the state of a round before the end depends on it), so that a
kill between the two writes leaves a run that resumes under either.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CHECKPOINT = "checkpoint.npz"
FORMAT = "fedsim-checkpoint-1"


class CheckpointError(ValueError):
    """The checkpoint cannot be used; the message says why. Nothing in the run directory was changed."""


@dataclass
class Checkpoint:
    round: int
    weights: np.ndarray
    strategy: dict[str, Any]


def config_digest(config_toml: str) -> str:
    return hashlib.sha256(config_toml.encode()).hexdigest()


def _digests(meta: dict[str, Any]) -> list[Any]:
    """The digests of the config texts a checkpoint was written for: ``config_sha256``, and after
    :func:`retarget_checkpoint` the config it was made for before (``config_sha256_also``)."""
    also = meta.get("config_sha256_also")
    return [meta.get("config_sha256"), *(also if isinstance(also, list) else [])]


def write_checkpoint(
    run_dir: Path, round_: int, weights: np.ndarray, strategy_state: dict[str, Any], config_toml: str
) -> Path:
    """Write ``checkpoint.npz`` atomically (temporary file, fsync, rename)."""
    state = dict(strategy_state)
    opt = dict(state.pop("server_optimizer", {}) or {})
    arrays = {"weights": np.asarray(weights, dtype=np.float64)}
    for key in ("m", "v"):
        if opt.get(key) is not None:
            arrays[f"server_optimizer_{key}"] = np.asarray(opt[key], dtype=np.float64)
    state = _arrays_out(state, arrays)  # e.g. a noise source's past draws
    meta = {
        "format": FORMAT,
        "round": int(round_),
        "config_sha256": config_digest(config_toml),
        "strategy": state,
    }
    target = run_dir / CHECKPOINT
    tmp = run_dir / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def read_checkpoint(run_dir: Path, config_toml: str) -> Checkpoint:
    """The run directory's checkpoint, checked: readable, of this format, and taken from this config."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(
            f"{run_dir} has no {CHECKPOINT}: nothing to resume from (checkpoints are written every "
            "engine.checkpoint_every rounds; 0 turns them off)"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            weights = np.array(z["weights"])
            opt = {
                k: np.array(z[f"server_optimizer_{k}"]) if f"server_optimizer_{k}" in z.files else None
                for k in "mv"
            }
            strategy = _arrays_in(dict(meta.get("strategy") or {}), z) if isinstance(meta, dict) else {}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); nothing was changed"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint; nothing was changed")
    if config_digest(config_toml) not in _digests(meta):
        raise CheckpointError(
            f"{path} was written for another config.toml than the one in {run_dir}; nothing was changed"
        )
    round_ = meta.get("round")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 1:
        raise CheckpointError(f"{path} names round {round_!r}; nothing was changed")
    if not np.all(np.isfinite(weights)):
        raise CheckpointError(f"{path} holds a model with non-finite values; nothing was changed")
    strategy["server_optimizer"] = opt
    return Checkpoint(round_, weights, strategy)


def retarget_checkpoint(run_dir: Path, old_config_toml: str, new_config_toml: str) -> Path:
    """Make the checkpoint of ``run_dir`` (written for ``old_config_toml``) valid for ``new_config_toml`` too, the
    same config with more rounds (a run extended by ``--resume --set rounds=M``); everything else in it is kept
    as it is. Written atomically like :func:`write_checkpoint`; call it before ``config.toml`` is replaced."""
    path = run_dir / CHECKPOINT
    try:
        with np.load(path, allow_pickle=False) as z:
            members = {k: np.array(z[k]) for k in z.files}
        meta = json.loads(str(members["meta"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); nothing was changed"
        ) from None
    if not isinstance(meta, dict) or config_digest(old_config_toml) not in _digests(meta):
        raise CheckpointError(
            f"{path} was written for another config.toml than the one in {run_dir}; nothing was changed"
        )
    meta["config_sha256"] = config_digest(new_config_toml)
    meta["config_sha256_also"] = [config_digest(old_config_toml)]
    members["meta"] = np.array(json.dumps(meta))
    tmp = run_dir / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **members)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


_ARRAY = "__array__"


def _arrays_out(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` with every NumPy array moved into ``arrays`` (a ``.npy`` member, no pickle) and replaced by a
    reference ``{"__array__": member}``: components keep any state they need (a noise source's past draws)."""
    if isinstance(value, np.ndarray):
        name = f"state_{len(arrays)}"
        arrays[name] = value
        return {_ARRAY: name}
    if isinstance(value, dict):
        return {k: _arrays_out(v, arrays) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_arrays_out(v, arrays) for v in value]
    return value


def _arrays_in(value: Any, members: Any) -> Any:
    """Undo :func:`_arrays_out` with the checkpoint's members."""
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return np.array(members[value[_ARRAY]])
        return {k: _arrays_in(v, members) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrays_in(v, members) for v in value]
    return value
