"""The remoting event loop's thread and the listening sockets of the remoting servers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["EventLoopThread", "bind"]


class EventLoopThread:
    """An asyncio event loop running on its own daemon thread."""

    def __init__(self, name: str = "rmq-remoting") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread_id = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            # closed by its own thread once it stops: a stop that gave up waiting for the thread
            # (a loaded machine) does not leave the loop and its self-pipe to the garbage collector
            if not self.loop.is_closed():
                self.loop.close()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (a coroutine function or a plain one) on the loop and wait for it."""

        async def run() -> Any:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def stop(self) -> None:
        """Cancel the tasks still pending (and let them finish), then stop and close the loop."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive() and threading.get_ident() != self.thread_id:
            try:
                self.call(_cancel_pending_tasks)
            except (
                RuntimeError,
                concurrent.futures.CancelledError,
            ):  # the loop is stopping already
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.get_ident() == self.thread_id:
            return
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_pending_tasks(timeout_s: float = 5.0) -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` (port 0: a free port)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
