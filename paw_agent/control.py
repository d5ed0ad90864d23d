"""Stopping a run: cancel, wall-clock deadline, and waits that notice both at once.

The run thread never blocks on anything it cannot leave: model calls, tools and answers
are waited for in short slices, and whatever is stopped gets its *stop hooks* called at
once (kill the tool's process group, close the HTTP stream, cancel the SQL query), so a
cancelled ``result`` leaves within the protocol's budget (1 s, issue 3).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# How often a wait wakes to look at the cancel flag and the deadline (s).
POLL = 0.05


class Stopped(Exception):  # a state, not an error
    """The run was stopped; ``reason`` is ``"cancelled"`` or ``"timeout"``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Watchdog:
    """One thread for the whole process that stops runs at their deadline, so a run
    blocked anywhere (a model that does not answer) is still stopped on time without a
    thread per run."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, RunControl]] = []
        self._thread: threading.Thread | None = None

    def watch(self, control: RunControl) -> None:
        assert control.deadline is not None
        with self._condition:
            heapq.heappush(self._heap, (control.deadline, id(control), control))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="paw-agent-watchdog", daemon=True
                )
                self._thread.start()
            self._condition.notify()

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._condition.wait(wait)
                _, _, control = heapq.heappop(self._heap)
            if not control.closed:
                control.stop("timeout")


_watchdog = _Watchdog()


class RunControl:
    """Cancel flag, optional deadline (``time.monotonic()`` seconds) and stop hooks of one
    run. Thread-safe: ``stop`` is called from the reader thread and the watchdog, the rest
    from the run's thread. ``close`` it when the run is over."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self.reason: str | None = None
        self.closed = False
        self._event = threading.Event()
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        if deadline is not None:
            _watchdog.watch(self)

    def close(self) -> None:
        """The run is over: its deadline no longer matters."""
        self.closed = True

    @property
    def stopped(self) -> bool:
        """Whether the run was stopped (cancelled or out of time)."""
        return self._event.is_set()

    def stop(self, reason: str = "cancelled") -> None:
        """Stop the run (idempotent; the first reason wins) and call every stop hook."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
            self._event.set()
            hooks = list(self._hooks)
        for hook in hooks:
            with contextlib.suppress(Exception):
                hook()

    def check(self) -> None:
        """Raise :class:`Stopped` if the run was stopped or its deadline passed."""
        if (
            self.deadline is not None
            and not self._event.is_set()
            and time.monotonic() >= self.deadline
        ):
            self.stop("timeout")
        if self._event.is_set():
            raise Stopped(self.reason or "cancelled")

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without one)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def _slice(self, limit: float | None = None) -> float:
        left = self.remaining()
        candidates = [POLL] + [x for x in (left, limit) if x is not None]
        return max(0.0, min(candidates))

    @contextlib.contextmanager
    def on_stop(self, hook: Callable[[], None]) -> Iterator[None]:
        """Within the block, ``hook`` is called if the run is stopped (at once if it already
        was)."""
        with self._lock:
            self._hooks.append(hook)
            already = self._event.is_set()
        if already:
            with contextlib.suppress(Exception):
                hook()
        try:
            yield
        finally:
            with self._lock:
                self._hooks.remove(hook)

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``; raise :class:`Stopped` as soon as the run stops."""
        end = time.monotonic() + seconds
        while True:
            self.check()
            left = end - time.monotonic()
            if left <= 0:
                return
            self._event.wait(self._slice(left))

    def wait_event(self, event: threading.Event, timeout: float | None = None) -> bool:
        """Wait for ``event`` (True) or ``timeout`` seconds (False; None = no limit); raise
        :class:`Stopped` as soon as the run stops."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self.check()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return event.is_set()
            if event.wait(self._slice(left)):
                return True

    def call(self, fn: Callable[[], T], on_stop: Callable[[], None] | None = None) -> T:
        """Run ``fn`` on a helper thread and return its value (or raise its exception);
        if the run stops first, call ``on_stop`` and raise :class:`Stopped` without waiting
        for ``fn`` to finish (the helper is a daemon thread)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=target, name="paw-agent-call", daemon=True).start()
        with self.on_stop(on_stop) if on_stop else contextlib.nullcontext():
            self.wait_event(done)
        if "error" in box:
            raise box["error"]
        return box["value"]
