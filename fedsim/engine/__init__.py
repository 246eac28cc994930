"""Engines behind one protocol (:class:`fedsim.loop.Engine`): Ray actors, in-process, and Flower's Simulation
Engine (through the same loop, inside Flower's ServerApp); and the runner that picks one for a scenario."""
