"""What produced a run: fedsim's version and git commit, and the versions of the libraries its numbers depend on.

Written to ``provenance.json`` when a run directory is created, before the first round, so that a run that
crashes or is killed still says what code it ran.
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: distributions whose versions decide a run's numbers (training, accounting, partitioning, the engines)
LIBRARIES = ("torch", "flwr", "ray", "dp-accounting", "flwr-datasets", "numpy", "scipy", "pydantic")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(path: Path) -> dict[str, Any] | None:
    """The commit of the git checkout holding ``path`` and whether its tracked files differ from it; ``None``
    outside a checkout (an installed wheel) or without git."""

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(
                ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=5, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def provenance() -> dict[str, Any]:
    import fedsim

    source = Path(fedsim.__file__).resolve().parent
    return {
        "fedsim": _version("fedsim"),
        "git": git_commit(source),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
