"""The form of an MLflow tracking URI (``[report] mlflow``), checked without importing or opening anything.

The scenario schema checks it when a scenario is loaded and :mod:`fedsim.report.trackers` again when MLflow is
started, with the same rule and message; it lives below both so that validating a scenario does not import the
report package (nor MLflow).
"""

from __future__ import annotations

from urllib.parse import urlparse

#: tracking URIs MLflow takes without a scheme
SCHEMELESS_URIS = ("databricks", "databricks-uc", "uc")


def check_tracking_uri(value: str) -> str:
    """``[report] mlflow``, checked for its form only (the scenario schema's rule): a URI with a scheme
    (``file:///abs/mlruns``, ``sqlite:///mlflow.db``, ``http://host:5000``), ``databricks``, or a folder written
    as a path: ``./mlruns`` or ``../mlruns`` (relative to the working directory), ``/abs/mlruns``, ``~/mlruns``.
    A bare word (``mlruns``, ``none``, ``true``) is refused: it would silently become a folder of that name."""
    value = value.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("a tracking URI or folder path has no control characters")
    scheme = urlparse(value).scheme
    if len(scheme) > 1 or value in SCHEMELESS_URIS or value.startswith(("/", "./", "../", "~")):
        return value
    raise ValueError(
        f"{value!r} is not a tracking URI; write a folder for a local file store as a path: "
        f"'./{value}' (relative to the working directory), '/abs/path' or 'file:///abs/path'"
    )
