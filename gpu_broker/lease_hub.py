"""The asyncio side of the broker: one queue per Acquire stream, the deadline timer, the watchers.

All state lives in the synchronous LeaseBook; this layer only feeds it the time and
delivers what it emits. Everything runs on the server's event loop, so no locks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from gpu_broker import metrics
from gpu_broker.lease_journal import LeaseJournal
from gpu_broker.usage_probe import attribute, parent_of
from gpu_broker.lease_book import (
    AcquireSpec,
    CancelOutcome,
    Ended,
    LeaseBook,
    Notice,
    Released,
    Snapshot,
    Transition,
)
from service_kit.auth import ANONYMOUS, Caller
from service_kit.errors import ResourceExhausted, Unavailable

log = logging.getLogger("gpu_broker.lease")

WATCH_BACKLOG = 10_000
# Live Watch streams at once: every transition is copied to each of them.
MAX_WATCHERS = 256


@dataclass(frozen=True)
class WatchEvent:
    transition: Transition | None  # None for the opening snapshot
    snapshot: Snapshot
    time: float


class _Watcher:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize=WATCH_BACKLOG)
        self.overflowed = False


class LeaseHub:
    def __init__(self, book: LeaseBook, clock=time.time, journal: LeaseJournal | None = None,
                 usage: Callable[[], dict[int, dict[int, int]]] | None = None, usage_interval_s: float = 2.0):
        self.book = book
        self.clock = clock
        self.journal = journal  # None: leases are not kept across a restart
        self._usage = usage  # device -> {pid: bytes} (NVML); None: holders' usage is not watched
        self._usage_interval_s = usage_interval_s
        self._usage_task: asyncio.Task | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._watchers: set[_Watcher] = set()
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        self._closed = False
        metrics.devices(book.devices)
        metrics.books(*book.live())

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
        if self._usage is not None and self._usage_interval_s > 0:
            self._usage_task = asyncio.get_running_loop().create_task(self._watch_usage())

    async def acquire(self, spec: AcquireSpec) -> AsyncIterator[Notice]:
        """Yields the stream's notices until it ends; frees whatever it held if the caller leaves."""
        if self._closed:
            raise Unavailable("broker is shutting down", reason="BROKER_SHUTTING_DOWN")
        request_id = self.book.submit(spec, self.clock())
        queue: asyncio.Queue[Notice] = asyncio.Queue()
        self._streams[request_id] = queue
        ended = False
        try:
            self._drain()
            while True:
                notice = await queue.get()
                if isinstance(notice.event, Ended):
                    ended = True
                    if notice.event.error is not None:
                        raise notice.event.error
                    return
                yield notice
        finally:
            del self._streams[request_id]
            if not ended:
                self.book.stream_closed(request_id, self.clock())
                self._drain()

    def release(self, lease_id: str, caller: Caller = ANONYMOUS) -> Released:
        try:
            return self.book.release(lease_id, self.clock(), caller)
        finally:
            self._drain()

    def cancel(self, *, request_id: str = "", lease_id: str = "", reason: str = "",
               caller: Caller = ANONYMOUS) -> CancelOutcome:
        try:
            return self.book.cancel(self.clock(), request_id=request_id, lease_id=lease_id, reason=reason,
                                    caller=caller)
        finally:
            self._drain()

    def set_busy(self, lease_id: str, busy: bool, caller: Caller = ANONYMOUS) -> tuple[str, ...]:
        try:
            return self.book.set_busy(lease_id, busy, self.clock(), caller)
        finally:
            self._drain()

    def status(self) -> Snapshot:
        return self.book.snapshot(self.clock())

    async def watch(self) -> AsyncIterator[WatchEvent]:
        if len(self._watchers) >= MAX_WATCHERS:
            raise ResourceExhausted(f"{MAX_WATCHERS} watchers are already attached (the most this broker serves); "
                                    "retry later", reason="TOO_MANY_WATCHERS")
        watcher = _Watcher()
        self._watchers.add(watcher)
        try:
            now = self.clock()
            yield WatchEvent(None, self.book.snapshot(now), now)
            while True:
                if watcher.overflowed and watcher.queue.empty():
                    raise ResourceExhausted(f"watcher fell more than {WATCH_BACKLOG} events behind; watch again",
                                            reason="WATCHER_TOO_SLOW")
                event = await watcher.queue.get()
                if event is None:
                    raise Unavailable("broker is shutting down", reason="BROKER_SHUTTING_DOWN")
                yield event
        finally:
            self._watchers.discard(watcher)

    async def shutdown(self) -> None:
        """Ends every Acquire stream with UNAVAILABLE and every watcher, then stops the timer. The journal keeps
        the leases as they were: their holders may still use the memory when a broker starts again."""
        self._closed = True
        self.journal = None
        self.book.shutdown(self.clock(), Unavailable(
            "broker is shutting down; the lease is void. Acquire again once it is back", reason="BROKER_SHUTTING_DOWN"))
        self._drain()
        for watcher in self._watchers:
            if not watcher.queue.full():
                watcher.queue.put_nowait(None)
        if self._ticker:
            self._ticker.cancel()
        if self._usage_task:
            self._usage_task.cancel()

    # ---- internals ------------------------------------------------------------------------

    def _drain(self) -> None:
        """Writes the lease set to the journal if it changed, then delivers the book's notices to their streams and
        its transitions to the log and watchers. The journal is written before any grant is delivered, so a holder
        never computes under a lease a restarted broker would not know."""
        if self.journal is not None:
            try:
                self.journal.save(self.book.journal())
            except OSError as e:  # the books still hold; a restart now would forget these leases
                log.error("lease journal not written", extra={"fields": {
                    "event": "broker.journal_write_failed", "path": str(self.journal.path), "error": str(e)}})
        leases, waiting = self.book.live()
        metrics.books(leases, waiting)
        for notice in self.book.outbox:
            queue = self._streams.get(notice.request_id)
            if queue is not None:
                queue.put_nowait(notice)
        self.book.outbox.clear()
        if not self.book.transitions:
            return
        transitions = list(self.book.transitions)
        self.book.transitions.clear()
        now = self.clock()
        snapshot = self.book.snapshot(now) if self._watchers else None
        for t in transitions:
            log.info(t.kind.value, extra={"fields": _log_fields(t)})
            metrics.transition(t.kind.value)
            for watcher in self._watchers:
                if watcher.queue.full():
                    watcher.overflowed = True
                else:
                    watcher.queue.put_nowait(WatchEvent(t, snapshot, t.time))
        self._wake.set()

    async def _watch_usage(self) -> None:
        """Every interval: what each holder's processes use on its device, against its lease (read off the loop)."""
        while True:
            await asyncio.sleep(self._usage_interval_s)
            try:
                on_device = await asyncio.to_thread(self._usage)
            except Exception as e:  # NVML hiccups must not stop the broker; say so and try again
                log.warning("device usage not read", extra={"fields": {"event": "broker.usage_unread",
                                                                       "error": str(e)}})
                continue
            holders = [(x.lease_id, x.device_index, x.holder.pid) for x in self.book.snapshot(self.clock()).leases]
            used = await asyncio.to_thread(attribute, on_device, holders, parent_of)
            self.book.report_usage(used, self.clock())
            self._drain()

    async def _tick_forever(self) -> None:
        while True:
            now = self.clock()
            deadline = self.book.next_deadline(now)
            timeout = None if deadline is None else max(0.0, deadline - now)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self.book.tick(self.clock())
            self._drain()


def _log_fields(t: Transition) -> dict:
    fields = {"event": f"lease.{t.kind.value}", "seq": t.sequence}
    if t.request_id:
        fields["request_id"] = t.request_id
    if t.lease_id:
        fields["lease_id"] = t.lease_id
    if t.holder is not None:
        fields.update(client_id=t.holder.client_id, priority=t.holder.priority, purpose=t.holder.purpose)
    if t.device_index >= 0:
        fields["device"] = t.device_index
    if t.detail:
        fields["detail"] = t.detail
    return fields
