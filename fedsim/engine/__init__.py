"""Engines behind one protocol (:class:`fedsim.loop.Engine`), one module each: Ray actors (:mod:`.ray_engine`),
in-process (:mod:`.local_engine`), and Flower's Simulation Engine (:mod:`.flower_engine`: the same loop, inside
Flower's ServerApp); and the runner that starts the one a scenario's ``engine.name`` names in
:mod:`fedsim.registry`."""
