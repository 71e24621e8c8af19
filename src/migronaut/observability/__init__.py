"""Observability: lifecycle events and logging helpers."""
