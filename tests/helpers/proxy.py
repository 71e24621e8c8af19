"""A TCP proxy in front of the test server, for network faults a real deployment sees.

:class:`TcpProxy` listens on ``127.0.0.1`` and forwards every connection to the server, byte for
byte. Faults, each opt-in:

* :meth:`TcpProxy.cut_all` — cut every live connection now (both sides), as a network blip, a
  restarted load balancer or a replica-set election does to a driver;
* :meth:`TcpProxy.drop_reply_after` — the next request carrying its markers (``b"update\\x00"``,
  and a name, say) is forwarded, and its reply is dropped and the connection cut: the server
  applied it, the client cannot know;
* :meth:`TcpProxy.delay_replies` — replies to requests carrying a marker are held back: a slow
  server, as the client measures it;
* :meth:`TcpProxy.hold_requests` — the next requests carrying its markers are held back and their
  connection cut at once (the client gives up on them), then delivered to the server — on a
  connection of their own, each applied before the proxy goes on — when a later request carries
  the release markers: a write still in flight, or queued on the server, that lands after the
  client has moved on.

:func:`cutting_connections` runs a thread that cuts every live connection at random intervals for a
while (a bounded loop on the loopback: it stops by itself). Markers are matched per chunk read
from the socket, which is enough for the small commands the tests send.

Example::

    with TcpProxy.in_front_of(mongo_uri) as proxy, cutting_connections(proxy, 0.5, 1.5, 40.0):
        run_workers(proxy.uri)
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pymongo.uri_parser import parse_uri

__all__ = ["TcpProxy", "cutting_connections"]


class _Pair:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        #: the last request on this connection carried the delay marker
        self.delayed = False
        #: the reply to the last request is to be dropped (and the connection cut)
        self.drop_reply = False
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``host:port``; see the module docstring for faults."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._base_uri: str | None = None
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._drop_markers: tuple[bytes, ...] = ()
        self._drops_left = 0
        #: set once a reply was dropped by :meth:`drop_reply_after`
        self.dropped = threading.Event()
        self._delay_marker: bytes | None = None
        self._delay_s = 0.0
        self._hold_markers: tuple[bytes, ...] = ()
        self._holds_left = 0
        self._release_markers: tuple[bytes, ...] = ()
        self._release_unless: tuple[bytes, ...] = ()
        self._held: list[bytes] = []
        #: requests held back by :meth:`hold_requests`, and how many were delivered since
        self.held = 0
        self.released = threading.Event()
        #: connections cut so far (by :meth:`cut_all` or a dropped reply)
        self.cuts = 0
        threading.Thread(target=self._accept, name="test-proxy-accept", daemon=True).start()

    @classmethod
    def in_front_of(cls, uri: str) -> TcpProxy:
        """A proxy in front of the first host of ``uri``; :attr:`uri` is ``uri`` through it."""
        host, port = parse_uri(uri)["nodelist"][0]
        proxy = cls(host, port)
        proxy._base_uri = uri
        return proxy

    @property
    def uri(self) -> str:
        """The server's URI with its host replaced by the proxy (a direct connection)."""
        if self._base_uri is None:
            return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"
        host, port = parse_uri(self._base_uri)["nodelist"][0]
        return self._base_uri.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    # -- faults -----------------------------------------------------------------------------
    def cut_all(self) -> int:
        """Cut every live connection now; returns how many were cut."""
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
            self.cuts += len(pairs)
        for pair in pairs:
            pair.close()
        return len(pairs)

    def drop_reply_after(self, *markers: bytes, times: int = 1) -> None:
        """Forward the next request containing every one of ``markers``, then drop its reply and
        cut the connection; ``times`` requests in a row."""
        self._drop_markers, self._drops_left = markers, times

    def delay_replies(self, marker: bytes | None, seconds: float = 0.0) -> None:
        """Hold back each reply to a request containing ``marker`` for ``seconds`` (``None``:
        no more delays)."""
        self._delay_marker, self._delay_s = marker, seconds

    def hold_requests(self, *markers: bytes, times: int = 1, release_on: tuple[bytes, ...],
                      release_unless: tuple[bytes, ...] = ()) -> None:
        """Hold back the next ``times`` requests containing every one of ``markers`` (their
        connection is cut at once); deliver them, in order and each to its reply, just before
        the next request that contains every one of ``release_on`` and none of
        ``release_unless``."""
        self._release_markers, self._release_unless = release_on, release_unless
        self._hold_markers, self._holds_left = markers, times

    def _hold(self, data: bytes) -> bool:
        markers = self._hold_markers
        if not markers or not all(marker in data for marker in markers):
            return False
        with self._lock:
            self._holds_left -= 1
            if self._holds_left <= 0:
                self._hold_markers = ()
            self._held.append(data)
            self.held += 1
        return True

    def _release_before(self, data: bytes) -> None:
        if not self._held or not all(marker in data for marker in self._release_markers):
            return
        if any(marker in data for marker in self._release_unless):
            return
        with self._lock:
            held, self._held = self._held, []
        for request in held:
            with socket.create_connection(self.target) as sock:
                sock.sendall(request)
                reply = b""
                while len(reply) < 4 or len(reply) < int.from_bytes(reply[:4], "little"):
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    reply += chunk
        self.released.set()

    # -- plumbing ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._upstream, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(pair,), daemon=True).start()

    def _upstream(self, pair: _Pair) -> None:
        try:
            while data := pair.client.recv(1 << 16):
                if self._hold(data):
                    with self._lock:
                        self.cuts += 1
                    break  # held back: the client's connection is cut, the request kept
                self._release_before(data)
                marker = self._delay_marker
                pair.delayed = marker is not None and marker in data
                drop = self._drop_markers
                if drop and all(marker in data for marker in drop):
                    with self._lock:
                        self._drops_left -= 1
                        if self._drops_left <= 0:
                            self._drop_markers = ()
                    pair.drop_reply = True
                pair.server.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(pair)

    def _downstream(self, pair: _Pair) -> None:
        try:
            while data := pair.server.recv(1 << 16):
                if pair.drop_reply:
                    self.dropped.set()
                    with self._lock:
                        self.cuts += 1
                    break  # the reply is dropped, the connection cut
                if pair.delayed and self._delay_s > 0:
                    time.sleep(self._delay_s)
                pair.client.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(pair)

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        pair.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut_all()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextmanager
def cutting_connections(
    proxy: TcpProxy, low_s: float, high_s: float, duration_s: float, *, seed: int = 1
) -> Iterator[threading.Event]:
    """Cut every live connection through ``proxy`` every ``low_s``–``high_s`` seconds (random)
    for ``duration_s`` seconds, in a thread. Yields an event set when the cutting is over; the
    thread is stopped and joined on exit."""
    rng = random.Random(seed)
    stop = threading.Event()
    over = threading.Event()

    def cut() -> None:
        deadline = time.monotonic() + duration_s
        while not stop.wait(rng.uniform(low_s, high_s)) and time.monotonic() < deadline:
            proxy.cut_all()
        over.set()

    thread = threading.Thread(target=cut, name="test-proxy-cutter", daemon=True)
    thread.start()
    try:
        yield over
    finally:
        stop.set()
        thread.join(10)
        over.set()
