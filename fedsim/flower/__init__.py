"""Flower ServerApp and ClientApp (`flwr run .`)."""
