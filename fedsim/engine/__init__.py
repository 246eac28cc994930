"""Engines: the Ray-backed simulator, an in-process engine, and the runner."""
