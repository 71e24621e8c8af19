"""The operator tools on top of the engine: dry runs and their aborted-transaction sandbox, drift
detection by polling, the live change-stream watcher and the ``background`` check of ``audit``."""
