"""Backends: one folder each; they import the core and their own driver, never each other.

A store of your own subclasses :class:`StoreRules` (every rule of the store contract, written
once: errors, the in-flight rule, paging, shared commits) and supplies its storage primitives;
:class:`AsyncStoreBridge` makes the async store of it. :mod:`duetime.testing.store_contract` is
the suite every built-in store passes; run it on yours (``docs/examples/dbm_store.py`` is a
small store on Python's ``dbm`` that the test suite runs through it).
"""

from duetime.backends._on_a_thread import AsyncStoreBridge
from duetime.backends._shared_commit import ROUND_LIMIT
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    by_due,
    matches,
)

__all__ = [
    "DEFAULT_CLAIM_TIMEOUT",
    "ROUND_LIMIT",
    "SCHEMA_VERSION",
    "AsyncStoreBridge",
    "Duplicate",
    "StoreRules",
    "by_due",
    "matches",
]
