"""fedsim: federated learning with client-level differential privacy."""

__version__ = "0.1.0"
