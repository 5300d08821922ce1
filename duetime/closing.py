"""``with`` / ``async with`` for everything that has a ``close()``: stores, transports, clients."""

from __future__ import annotations

from typing import Protocol, TypeVar


class _AsyncClosable(Protocol):
    async def close(self) -> None: ...


class _Closable(Protocol):
    def close(self) -> None: ...


A = TypeVar("A", bound=_AsyncClosable)
S = TypeVar("S", bound=_Closable)


class AsyncClosing:
    """``async with store:`` closes the store on the way out, whatever happened inside."""

    async def __aenter__(self: A) -> A:
        return self

    async def __aexit__(self: _AsyncClosable, *exc: object) -> None:
        await self.close()


class Closing:
    """``with store:`` closes the store on the way out, whatever happened inside."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(self: _Closable, *exc: object) -> None:
        self.close()
