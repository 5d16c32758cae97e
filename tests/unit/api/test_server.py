"""Serving on the unix socket: its mode, no TCP listener, stale and live sockets, clean-up."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from ipamd.api import SocketPathError, bodies, create_app, serve_unix
from tests.support.node import NodeFixture
from tests.unit.api.conftest import Api


async def test_socket_has_mode_0660_and_is_the_only_listener(api: Api) -> None:
    mode = os.stat(api.socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660
    [address] = api.runner.addresses
    assert isinstance(address, str), "a unix socket's name, not a TCP (host, port)"
    assert list(api.socket_path.parent.iterdir()) == [api.socket_path], "no temporary name left"


async def test_a_stale_socket_is_replaced_and_removed_on_cleanup(
    node: NodeFixture, socket_dir: Path
) -> None:
    engine = await node.open()
    path = socket_dir / "ipamd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed daemon leaves behind
    runner = await serve_unix(
        create_app(engine, ready=lambda: True, gc_grace_s=0, clock=node.clock), path
    )
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
    finally:
        await runner.cleanup()
    assert not path.exists()


async def test_a_live_socket_is_never_taken_over(api: Api) -> None:
    app = create_app(api.engine, ready=lambda: True, gc_grace_s=0, clock=api.node.clock)
    with pytest.raises(SocketPathError, match="another process"):
        await serve_unix(app, api.socket_path)
    assert (await api.call("GET", "/healthz")).status == 200


async def test_a_path_that_is_not_a_socket_is_left_alone(
    node: NodeFixture, socket_dir: Path
) -> None:
    engine = await node.open()
    path = socket_dir / "ipamd.sock"
    path.write_text("precious")
    app = create_app(engine, ready=lambda: True, gc_grace_s=0, clock=node.clock)
    with pytest.raises(SocketPathError, match="not a socket"):
        await serve_unix(app, path)
    assert path.read_text() == "precious"


async def test_a_path_too_long_for_a_unix_socket_is_refused(
    node: NodeFixture, socket_dir: Path
) -> None:
    engine = await node.open()
    app = create_app(engine, ready=lambda: True, gc_grace_s=0, clock=node.clock)
    with pytest.raises(SocketPathError, match="longer than"):
        await serve_unix(app, socket_dir / ("d" * 100) / "ipamd.sock")


async def test_hundreds_of_clients_connecting_at_once_are_all_queued(api: Api) -> None:
    """While the loop is busy (here: not running at all between the connects), the kernel queues
    them; a backlog of 128 refused the rest (EAGAIN) when a node started hundreds of pods at once."""
    clients: list[socket.socket] = []
    try:
        for _ in range(300):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            clients.append(client)
            client.setblocking(False)
            client.connect(str(api.socket_path))  # raises BlockingIOError when the queue is full
    finally:
        for client in clients:
            client.close()
    assert len(clients) == 300
    assert (await api.call("GET", "/healthz")).status == 200


async def test_a_body_that_never_finishes_is_answered_408_and_closed(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "BODY_TIMEOUT_S", 0.2)
    reader, writer = await asyncio.open_unix_connection(str(api.socket_path))
    try:
        writer.write(
            b"POST /v1/allocations HTTP/1.1\r\nHost: ipamd\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            b'{"container_id":'
        )
        await writer.drain()
        async with asyncio.timeout(5):
            answer = await reader.read()  # until the server closes the connection
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["code"] == "request_timeout"
    assert api.engine.state.allocations() == {}
