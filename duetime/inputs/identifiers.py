"""Validation of endpoint and queue names, shared by every backend that builds identifiers."""

from __future__ import annotations

import hashlib
import re

from duetime.errors import ConfigurationError

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")


def check_name(kind: str, name: str) -> str:
    """Endpoint and queue names: letters, digits, ``_ . -``, at most 100 characters."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"{kind} name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
            "starting with a letter, digit or '_' (e.g. 'orders' or 'orders.timeouts')."
        )
    return name


def quote_identifier(name: str) -> str:
    """Quote a SQL identifier; names are validated too, so quoting is the second fence."""
    return '"' + name.replace('"', '""') + '"'


def postgres_name(name: str) -> str:
    """``name`` as a PostgreSQL identifier holds it: at most 63 bytes. PostgreSQL would cut a
    longer one silently, so two endpoints that start alike would share a table; a long name is
    cut here with a hash of the whole, so each keeps its own. The store and the bulk jobs alike."""
    if len(name.encode()) > 63:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = name.encode()[:52].decode(errors="ignore") + "_" + digest
    return name


def mariadb_name(name: str) -> str:
    """``name`` as a MariaDB table's name holds it: at most 64 characters (MariaDB refuses a
    longer one); a long name is cut with a hash of the whole, as :func:`postgres_name` does."""
    if len(name) > 64:
        name = name[:53] + "_" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name
