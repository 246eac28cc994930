"""How many threads torch's CPU operators use where a cohort trains (``engine.torch_threads``).

PyTorch starts with one intra-op thread per core. That suits one large operator at a time, not fedsim's training:
the per-client loop runs a small model on a batch of 16 examples, one client after the other, so each operator has
too little work to split and every extra thread only adds a synchronisation (and, on a machine shared with other
processes, spins on a core someone else needs). On 2 cores the loop path ran a round in 0.442 s on 1 thread and
1.377 s on 2 (3.1x, issue 34). The vectorised paths (per-layer rules, ``torch.func`` vmap) batch a chunk of clients
into each operator, which gives a second thread work to share, but in process it competes with the driver's own
work (the accountant's background thread, evaluation bookkeeping). ``benchmarks/threads.py`` measures each engine
and path at 1 and 2 threads and at what ``auto`` chooses.

``engine.torch_threads = "auto"`` (the default) therefore chooses per engine and training path
(:func:`choose_threads`):

* the **per-client loop**: 1 thread, in the in-process engine and in every Ray worker;
* the **vectorised paths**: in a Ray worker, one thread per CPU Ray reserved for it (``num_cpus_per_worker``,
  at least 1); in the in-process engine, one per usable CPU less one left to the driver's own work (at least 1),
  and never more than the process had when the engine started (``OMP_NUM_THREADS``, a caller's
  ``torch.set_num_threads``, or Ray's limit for a task: a sweep's parallel runs).

A whole number fixes the count for every path and engine. The count used and why are in ``summary.json``'s
``engine`` (``torch_threads``, ``torch_threads_why``). The in-process engine sets it around each call that trains or
evaluates (:func:`torch_threads`) and gives the caller's count back after it, so a Python caller's torch is left as
it was, between rounds as after the run, closed or not.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

#: the value of ``engine.torch_threads`` that lets fedsim choose
AUTO = "auto"
#: the training paths that batch a chunk of clients into each operator (:mod:`fedsim.training.vectorized`)
VECTORISED_PATHS = ("per-layer", "vmap")


#: the most threads ``engine.torch_threads`` may ask for (a bound on typing mistakes, not a recommendation)
MAX_THREADS = 1024


def check_setting(value: Any, option: str = "engine.torch_threads") -> int | str:
    """``value`` if it is ``"auto"`` or a whole number in [1, :data:`MAX_THREADS`], else a ValueError naming
    ``option``."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise ValueError(
            f"invalid {option}={value!r}: allowed 'auto' or a whole number of threads in [1, {MAX_THREADS}]"
        )
    return int(value)


def choose_threads(
    setting: Any,
    path: str,
    *,
    worker_cpus: float | None = None,
    cpus: int | None = None,
    current: int | None = None,
) -> tuple[int, str]:
    """The torch thread count for training on ``path`` (``per-layer``, ``vmap`` or ``loop``), and why.

    ``setting``: ``engine.torch_threads`` (``"auto"`` or a whole number). ``worker_cpus``: the CPUs Ray reserved
    for the worker that trains (None: the in-process engine). ``cpus``: the usable CPUs of this process
    (default: :func:`fedsim.engine.auto.usable_cpus`); ``current``: its torch thread count before the engine
    (default: ``torch.get_num_threads()``). See the module docstring for the rules."""
    setting = check_setting(setting)
    if setting != AUTO:
        return int(setting), f"engine.torch_threads={setting}"
    where = "each Ray worker" if worker_cpus is not None else "the in-process engine"
    if path not in VECTORISED_PATHS:
        return 1, (
            f"auto: the per-client loop in {where} runs one small batch at a time, which a second thread only slows"
        )
    if worker_cpus is not None:
        n = max(1, math.floor(worker_cpus))
        return n, f"auto: the {path} path, one thread per CPU Ray reserved for each worker ({worker_cpus:g})"
    if cpus is None:
        from .auto import usable_cpus

        cpus = usable_cpus()
    current = torch.get_num_threads() if current is None else int(current)
    n = max(1, min(cpus - 1, current))
    why = f"auto: the {path} path in process, one thread per usable CPU ({cpus}) less one for the driver"
    if current < cpus - 1:
        why += f", at most the {current} this process had"
    return n, why


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` inside the block, and given back as it was found after it."""
    previous = torch.get_num_threads()
    if previous != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
