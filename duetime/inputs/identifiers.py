"""Validation of endpoint and queue names, shared by every backend that builds identifiers."""

from __future__ import annotations

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
