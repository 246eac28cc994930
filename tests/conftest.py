"""Test-wide environment: no network, no telemetry, Flower and Ray state in a temporary folder."""

import os
import tempfile

_TMP = tempfile.mkdtemp(prefix="fedsim-test-")
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_DEDUP_LOGS": "0",
}.items():
    os.environ.setdefault(key, value)
os.environ.setdefault("FLWR_HOME", os.path.join(_TMP, "flwr"))
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="r", dir="/tmp"))
