"""The store contract on a store written outside duetime: ``docs/examples/dbm_store.py``, a small
store on Python's ``dbm`` built from the public store kit (``duetime.backends.StoreRules`` and
``AsyncStoreBridge``), runs the same suite as every built-in store."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from duetime.testing.store_contract import StoreContract

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "dbm_store.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dbm_store", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dbm_store"] = module
    spec.loader.exec_module(module)
    return module


dbm_store = _example()


class TestDbmStore(StoreContract):
    @pytest.fixture
    def shared(self, tmp_path: Path) -> Any:
        return dbm_store.DbmStore(dbm_store.DbmSyncStore(str(tmp_path / "delayed.dbm")))

    @pytest.fixture
    def make_store(self, shared: Any) -> Callable[[], Any]:
        return lambda: shared

    @pytest.fixture
    def make_sync_store(self, shared: Any) -> Callable[[], Any]:
        return lambda: shared.sync
