"""The HTTP API (``duetime serve``): schedule, look up and cancel delayed messages from any
language. :class:`HttpApi` is the library object; ``HttpApi.app()`` is its ASGI application."""

from duetime.api.state import HttpApi

__all__ = ["HttpApi"]
