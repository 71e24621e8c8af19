"""Shared helpers of the engine, config, lock and process tests (not fixtures: plain functions)."""
