"""Test-wide environment: no network, no telemetry, Flower and Ray state in a temporary folder, and a fresh
cache for fedsim's generated data (so that every test run generates it from its arguments).

This folder is on ``sys.path`` (pytest puts a rootdir conftest's folder there), so ``user_models.py`` beside
this file is importable as ``user_models``, the way a user's own module would be.
"""

import atexit
import os
import shutil
import tempfile

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-test-")
if "FEDSIM_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="fedsim-test-cache-")
    os.environ["FEDSIM_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# Hypothesis (tests/cli/test_fuzz.py): under CI the examples are derived from each test, not drawn afresh, so a
# red build is reproducible and never a new draw's luck; locally every run explores new inputs.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")
