"""Capability environments (one file per capability)."""
