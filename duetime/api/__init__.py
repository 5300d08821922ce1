"""The HTTP API (``duetime serve``): schedule, look up and cancel delayed messages from any
language. :class:`HttpApi` is the library object; ``HttpApi.app()`` is its ASGI application.

It needs the ``api`` extra; without it, importing this says so in one line."""

from duetime.errors import MissingExtra

try:
    from duetime.api.state import HttpApi
except ModuleNotFoundError as missing:  # FastAPI or uvicorn not installed
    raise MissingExtra.for_module(missing, "duetime.api") or missing from None

__all__ = ["HttpApi"]
