"""Declared collections: what a team says its collections must look like, as data.

This package reads and validates the definitions (inline ``collections`` and the files of
``collections_dir``) into a frozen, normalized model, and owns the value comparison every later
step uses. It never talks to a database: the converge planner consumes its model.

Modules: :mod:`.canonical` (comparison form), :mod:`.values` (what can be sent as written),
:mod:`.indexes`, :mod:`.search`, :mod:`.versioning` (one part of a definition each),
:mod:`.definition` (one definition object), :mod:`.sources` (inline + directory, lazily);
the converge planner :mod:`.planner` over :mod:`.live` state, with :mod:`.index_compare`,
:mod:`.index_plan`, :mod:`.search_plan`, :mod:`.versioned` and the shapes of :mod:`.plan`.
Nothing is imported here, so the config can validate inline definitions without loading the rest.
"""
