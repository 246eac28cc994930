"""Process environment for simulation: offline, no telemetry, Flower and Ray state in a temporary folder.

Imports nothing heavy, so it can run before ``flwr`` or ``ray`` are imported. Values already set win.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

OFFLINE_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_DEDUP_LOGS": "0",
    # Ray's usage statistics: a report thread in every local instance, and nothing fedsim needs
    "RAY_USAGE_STATS_ENABLED": "0",
}


def cache_dir() -> Path:
    """Where fedsim caches what it builds (generated datasets, compiled kernels): ``$FEDSIM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fedsim``, else ``~/.cache/fedsim``."""
    env = os.environ.get("FEDSIM_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "fedsim" if xdg else Path.home() / ".cache" / "fedsim"


def set_offline_defaults(private_state: bool = False, prefix: str = "fedsim-") -> None:
    """Set :data:`OFFLINE_DEFAULTS`; with ``private_state``, also ``FLWR_HOME`` and a short ``RAY_TMPDIR``
    (Ray's socket paths must stay short) in fresh temporary folders."""
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if private_state:
        os.environ.setdefault("FLWR_HOME", os.path.join(tempfile.mkdtemp(prefix=prefix), "flwr"))
        os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="r", dir="/tmp"))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: from ``/proc``, to the kernel's clock tick), or ``None`` where the
    operating system does not say: what ``fedsim run`` reports as ``startup_s`` (the interpreter and its imports,
    before the run's first step)."""
    try:
        with open("/proc/self/stat") as f:
            # the command name (field 2) may hold spaces: the fields after it follow its closing parenthesis
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
