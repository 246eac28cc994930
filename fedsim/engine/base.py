"""What every engine shares: the error an engine raises when it cannot go on.

The protocol an engine implements is :class:`fedsim.loop.Engine`; engines are chosen by ``engine.name`` through
the registry (:mod:`fedsim.registry`)."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine cannot go on (a worker that could not be replaced): not the user's input, not a client's fault.
    ``fedsim run`` reports it in one line (exit 1); every round finished before it is written."""
