"""The fault model: one asyncio TCP proxy per worker on loopback, hosted by one event loop in a
thread (see the package's docstring for what it emulates and what it cannot)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from bench.network_faults.processes import CLIENTS

CHUNK = 65536  # one read() of a forwarded stream


@dataclass(frozen=True)
class Faults:
    delay: float = 0.0  # one-way, per chunk, seconds
    loss: float = 0.0  # probability that a new connection or a chunk stalls
    syn_stall: float = 1.0  # a lost SYN: the initial RTO (RFC 6298)
    chunk_stall: float = 0.4  # a lost segment: one RTO at the emulated round trip


@dataclass
class ProxyStats:
    connections: int = 0
    stalled_connections: int = 0
    chunks: int = 0
    stalled_chunks: int = 0
    bytes: int = 0
    held_by_partition: int = 0  # chunks that waited for a partition to end
    reset_by_partition: int = 0  # connections reset by a ``refuse`` partition
    first_pass_request: float | None = None  # time.monotonic() of the first /passes/ request


@dataclass
class Partition:
    worker: int
    seconds: float
    mode: str  # hold | refuse
    at_pass: int
    started_at: float | None = None  # seconds since the workers started
    ended_at: float | None = None
    status_during: str = ""


class Proxy:
    """One worker's path to the service: 127.0.0.1:port -> the service, with :class:`Faults`."""

    def __init__(self, *, upstream_port: int, faults: Faults, seed: int) -> None:
        self.upstream_port = upstream_port
        self.faults = faults
        self.rng = random.Random(seed)
        self.stats = ProxyStats()
        self.healed = asyncio.Event()
        self.healed.set()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, *, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def partition(self, *, seconds: float, mode: str) -> None:
        self.healed.clear()
        if mode == "refuse":
            await self._refuse()
        await asyncio.sleep(seconds)
        if mode == "refuse":
            await self.start(port=self.port)
        self.healed.set()

    async def _refuse(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            self.stats.reset_by_partition += 1
            writer.transport.abort()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()

    def _stall(self, seconds: float) -> float:
        return seconds if self.rng.random() < self.faults.loss else 0.0

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        syn = self._stall(self.faults.syn_stall)
        self.stats.stalled_connections += syn > 0
        handshake = asyncio.get_running_loop().time() + 2 * self.faults.delay + syn
        self.writers.add(client_w)
        try:
            await self._wait_healed()
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            self.writers.discard(client_w)
            return
        self.writers.add(up_w)
        try:
            await asyncio.gather(
                self._pipe(client_r, up_w, not_before=handshake, upstream=True),
                self._pipe(up_r, client_w, not_before=0.0, upstream=False),
                return_exceptions=True,  # a reset ends the connection, nothing more
            )
        finally:
            for writer in (client_w, up_w):
                self.writers.discard(writer)
                writer.transport.abort()

    async def _wait_healed(self) -> None:
        if not self.healed.is_set():
            self.stats.held_by_partition += 1
            await self.healed.wait()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        not_before: float,
        upstream: bool,
    ) -> None:
        """Forward ``reader`` to ``writer`` chunk by chunk, each due after the delay (and a
        stall), never before the chunk ahead of it."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forward = asyncio.create_task(self._deliver(queue, writer))
        last_due = not_before
        loop = asyncio.get_running_loop()
        try:
            while chunk := await reader.read(CHUNK):
                stall = self._stall(self.faults.chunk_stall)
                self.stats.chunks += 1
                self.stats.stalled_chunks += stall > 0
                self.stats.bytes += len(chunk)
                if upstream and self.stats.first_pass_request is None and b"/passes/" in chunk:
                    self.stats.first_pass_request = time.monotonic()
                last_due = max(last_due, loop.time() + self.faults.delay + stall)
                queue.put_nowait((last_due, chunk))
        finally:
            queue.put_nowait((last_due, b""))  # end of stream (or of the connection)
            await forward

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes]], writer: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._wait_healed()
            if writer.transport.is_closing():
                return
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()


class ProxyLoop:
    """An event loop in a thread, hosting the proxies; the main thread drives the processes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def proxies(self, *, upstream_port: int, faults: Faults, seed: int) -> list[Proxy]:
        async def make() -> list[Proxy]:
            made = [
                Proxy(upstream_port=upstream_port, faults=faults, seed=seed + m)
                for m in range(CLIENTS)
            ]
            for proxy in made:
                await proxy.start()
            return made

        return self.run(make())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
