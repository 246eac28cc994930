"""Test-wide environment: no network, no telemetry, Flower and Ray state in a temporary folder."""

from fedsim.env import set_offline_defaults

set_offline_defaults(private_state=True, prefix="fedsim-test-")
