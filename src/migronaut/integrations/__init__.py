"""ODM integrations of :mod:`migronaut.versioning` (reference collections §3.5, the Python
analogue of the original's Mongoose plugin): :mod:`.beanie` and :mod:`.mongoengine`.

Each module imports its ODM, so each needs its optional extra (``migronaut[beanie]``,
``migronaut[mongoengine]``); this package imports neither. Both keep the contract in one place —
the registry stamps, the guarded writers write, the upcaster upgrades — and only wire it into the
ODM's document life cycle: stamping on insert, the revision guard on save/replace/update, the
upcaster on load.
"""
