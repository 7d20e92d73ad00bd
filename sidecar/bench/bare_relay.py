"""A bare asyncio TCP relay: the floor for any Python relay on this machine.

Bytes are passed between client and upstream sockets with asyncio Protocols and nothing else:
no HTTP parsing, no measurement. `goodput bench sidecar` compares the sidecar's CPU per relayed
token with this process's.
"""

from __future__ import annotations

import argparse
import asyncio

from sidecar import eventloop


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection; writes what it receives to its peer's transport."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.peer: "_Pipe | None" = None
        self._pending: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self._pending.append(data)

    def flush_to(self, peer: "_Pipe") -> None:
        self.peer = peer
        for data in self._pending:
            peer.transport.write(data)
        self._pending.clear()

    # Flow control: when the peer cannot take more, stop reading from this side.
    def pause_writing(self):
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self):
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc):
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Downstream(_Pipe):
    def __init__(self, upstream_host: str, upstream_port: int):
        super().__init__()
        self._target = (upstream_host, upstream_port)

    def connection_made(self, transport):
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self):
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Pipe, *self._target)
        except OSError:
            self.transport.close()
            return
        up.peer = self
        self.flush_to(up)


async def serve(port: int, upstream_host: str, upstream_port: int, host: str = "127.0.0.1", ready=print) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Downstream(upstream_host, upstream_port), host, port, backlog=1024)
    ready(f"bare relay on http://{host}:{port} -> {upstream_host}:{upstream_port}")
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="bare asyncio TCP relay (benchmark floor)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--upstream-host", default="127.0.0.1")
    args = p.parse_args(argv)
    try:
        eventloop.run(serve(args.port, args.upstream_host, args.upstream_port, ready=lambda s: print(s, flush=True)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
