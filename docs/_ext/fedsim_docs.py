"""Sphinx extension: fedsim's generated reference pages (filled in by the reference work)."""

from __future__ import annotations


def setup(app):
    return {"version": "1", "parallel_read_safe": True}
