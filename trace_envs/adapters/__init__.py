"""Adapters that plug TRACE environments into other trainers."""
