"""The floor under `bench.api`'s figures: a trivial HTTP/1.1 server on a unix socket, in a process of
its own, that answers every request with the same small JSON and closes the connection.

`python -m bench.socket_floor PATH`: binds PATH, prints `ready`, then serves one connection at a time
until killed: reads the request's head and its `Content-Length` body, writes a fixed 200 answer with
`Content-Length`, closes. A round trip to it is what connecting, one write, one read and the two
processes' wake-ups cost on this machine at this moment, with no parsing, routing or engine behind
it: the least any request to the daemon's socket could take.

It must not import asyncio, aiohttp or ipamd: the floor is the kernel and the interpreter, nothing of
ours.
"""

from __future__ import annotations

import socket
import sys

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
)


def _read_request(conn: socket.socket) -> None:
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    length = 0
    for line in data[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(data) - end - 4 < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


def serve(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(4096)
        print("ready", flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                _read_request(conn)
                conn.sendall(ANSWER)


if __name__ == "__main__":
    serve(sys.argv[1])
