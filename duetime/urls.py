"""URL helpers every backend shares."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``: the only form that goes into logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
