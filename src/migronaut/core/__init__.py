"""Mechanisms of the core migration line: config, changelog, lock, files, runner, planning."""
