"""A TCP proxy owned by a test, for outages without touching the shared server: ``cut()`` drops
every connection and refuses new ones (a restart), ``blackhole()`` keeps every connection open but
holds its bytes and lets new ones connect to nothing (a network partition), ``slow(seconds)``
delays traffic, ``restore()`` heals (held bytes then flow on, as TCP would retransmit them)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.down = False
        self.held = False
        self.delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # tracked from the start: a connection held by a partition when the proxy closes is closed
        # too, not left to the garbage collector ("unclosed transport", a failure in a later test)
        self._writers.add(writer)
        try:
            if self.down:
                return
            while self.held:  # a partition: the client's connect "succeeds", then nothing answers
                await asyncio.sleep(0.05)
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                await asyncio.gather(
                    self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
                )
            finally:
                self._writers.discard(up_writer)
                up_writer.close()
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.down:
                    break
                while self.held:
                    await asyncio.sleep(0.05)
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy instead of the server."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    def cut(self) -> None:
        def drop() -> None:
            self.down = True
            for w in list(self._writers):
                w.close()

        self._loop.call_soon_threadsafe(drop)

    def blackhole(self) -> None:
        self.held = True

    def slow(self, seconds: float) -> None:
        self.delay = seconds

    def restore(self) -> None:
        self.down = False
        self.held = False
        self.delay = 0.0

    def close(self) -> None:
        """Every connection's task ends here: a loop stopped with them pending left them to the
        garbage collector, whose "Task was destroyed but it is pending!" then landed in whatever
        test ran next (and failed one that checks asyncio logs nothing)."""

        async def shutdown() -> None:
            self.down = True
            self._server.close()
            for w in list(self._writers):
                w.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()


@contextlib.contextmanager
def proxy_for(url: str) -> Iterator[TcpProxy]:
    parts = urlsplit(url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        yield proxy
    finally:
        proxy.close()
