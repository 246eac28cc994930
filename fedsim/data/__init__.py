"""Offline federated datasets: base data, partitioners, domains and held-out clients.

>>> from fedsim.data import build_federated_data
>>> fd = build_federated_data("digits", num_clients=100, partitioner="dirichlet", alpha=0.5)
>>> x, y = fd.client_data(int(fd.train_clients[0]))
"""

from fedsim.data.federated import (
    DATASET_OPTIONS,
    DATASETS,
    ArrayFederatedData,
    SyntheticFederatedData,
    build_federated_data,
)
from fedsim.data.partition import PARTITIONER_OPTIONS, PARTITIONERS
from fedsim.data.population import FederatedData

__all__ = [
    "DATASETS",
    "DATASET_OPTIONS",
    "PARTITIONERS",
    "PARTITIONER_OPTIONS",
    "ArrayFederatedData",
    "FederatedData",
    "SyntheticFederatedData",
    "build_federated_data",
]
