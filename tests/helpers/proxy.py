"""A TCP proxy in front of the test server that drops connections the way a network does.

Two faults, both real TCP closes the driver sees exactly as it would see a network failure:

* **A lost reply** (``cut_reply_to=...``): the first client message containing every given byte
  string is forwarded, then that connection is cut instead of passing the server's reply back —
  the server applied the command, the client cannot know. One-shot: ``armed`` is set when the
  command went through, ``cut`` when the reply was dropped.
* **Chaos** (:meth:`TcpProxy.cut_every`): a thread closes every live connection at random
  intervals (seeded), until :meth:`TcpProxy.calm` or :meth:`TcpProxy.close`.

Only loopback addresses are involved: the proxy listens on 127.0.0.1 and connects to the test
server. Every thread is a daemon and every loop ends when the proxy is closed.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pymongo.uri_parser import parse_uri

__all__ = ["TcpProxy", "proxy_for"]


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``host``:``target_port``."""

    def __init__(
        self, host: str, target_port: int, *, cut_reply_to: Sequence[bytes] | None = None
    ) -> None:
        self.target = (host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.cut_reply_to = tuple(cut_reply_to or ())
        self.armed = threading.Event()
        self.cut = threading.Event()
        #: Connections closed by :meth:`cut_every` so far.
        self.cuts = 0
        self.closed = False
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._calm = threading.Event()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    # -- forwarding ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                self._close(client)
                continue
            with self._lock:
                self._live.update((client, server))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if not upstream and self.armed.is_set() and not self.cut.is_set():
                    self.cut.set()  # the reply to the marked command: dropped, connection cut
                    break
                sink.sendall(data)
                if upstream and self.cut_reply_to and not self.armed.is_set() \
                        and all(marker in data for marker in self.cut_reply_to):
                    self.armed.set()
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._live.discard(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    # -- chaos --------------------------------------------------------------------------------
    def cut_every(self, low_s: float, high_s: float, *, seed: int) -> None:
        """Close every live connection every ``low_s``–``high_s`` seconds until :meth:`calm`."""
        self._calm.clear()
        rng = random.Random(seed)

        def loop() -> None:
            while not self._calm.wait(rng.uniform(low_s, high_s)) and not self.closed:
                with self._lock:
                    live = list(self._live)
                if live:
                    self.cuts += 1
                    self._close(*live)

        threading.Thread(target=loop, name="proxy-chaos", daemon=True).start()

    def calm(self) -> None:
        """Stop cutting (connections made from now on live as long as their peers keep them)."""
        self._calm.set()

    def close(self) -> None:
        self.closed = True
        self._calm.set()
        self.listener.close()
        with self._lock:
            live = list(self._live)
        self._close(*live)


@contextmanager
def proxy_for(mongo_uri: str, *, cut_reply_to: Sequence[bytes] | None = None
              ) -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` in front of the (single) server of ``mongo_uri``, closed on exit."""
    host, port = parse_uri(mongo_uri)["nodelist"][0]
    proxy = TcpProxy(host, port, cut_reply_to=cut_reply_to)
    try:
        yield proxy
    finally:
        proxy.close()
