"""``duckflock worker --listen HOST:PORT``, checked before the Flight server binds it: gRPC reports a
port in use or a host it cannot resolve only as "Server did not start properly", after logging to
stderr itself, so the worker says instead what is wrong, in one line."""

from __future__ import annotations

import socket

from duckflock.errors import DuckflockError


def check_listen(listen: str) -> tuple[str, int]:
    """(host, port) of ``listen``, once a socket could be bound there (port 0: any free port)."""
    host, colon, port_text = listen.rpartition(":")
    if not colon or not port_text.isdigit():
        raise DuckflockError(f"--listen wants HOST:PORT, got {listen!r}")
    port = int(port_text)
    if port > 65535:
        raise DuckflockError(f"--listen {listen}: port {port} is out of range (0-65535)")
    if not host:
        raise DuckflockError(f"--listen {listen}: give the host too (0.0.0.0:{port}: every interface)")
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        cause = getattr(e, "strerror", None) or e
        raise DuckflockError(f"--listen {listen}: cannot resolve host {host!r} ({cause})") from None
    problems = []
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
                s.bind(address)
            return host, port  # gRPC listens on every address it can bind, and needs one
        except OSError as e:
            problems.append(e.strerror or str(e))
    raise DuckflockError(f"cannot listen on {listen}: {'; '.join(dict.fromkeys(problems))}")
