"""Test-wide environment: no network, no telemetry, Flower and Ray state in a temporary folder, and a fresh
cache for fedsim's compiled kernels (so that every test run builds them from source)."""

import os
import tempfile

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-test-")
os.environ.setdefault("FEDSIM_CACHE_DIR", tempfile.mkdtemp(prefix="fedsim-test-kernels-"))
