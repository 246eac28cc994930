"""Test-wide environment: no network, no telemetry, Flower and Ray state in a temporary folder, and a fresh
cache for fedsim's compiled kernels (so that every test run builds them from source)."""

import atexit
import os
import shutil
import tempfile

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-test-")
if "FEDSIM_CACHE_DIR" not in os.environ:
    _kernels = tempfile.mkdtemp(prefix="fedsim-test-kernels-")
    os.environ["FEDSIM_CACHE_DIR"] = _kernels
    atexit.register(shutil.rmtree, _kernels, ignore_errors=True)
