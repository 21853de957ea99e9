"""The broker's state machine: leases, waiters, preemptions and deadlines. Synchronous and pure.

Time is passed in (`now`, seconds); nothing here sleeps, locks or touches gRPC. Each
operation validates first and raises before changing anything, then applies the
placement plan and queues what the streams should hear (`outbox`) and what the
timeline should record (`transitions`). The asyncio layer (lease_hub) drains both.
"""
from __future__ import annotations

import heapq
import math
import uuid
from dataclasses import dataclass, replace
from enum import Enum

from sortedcontainers import SortedKeyList

from gpu_broker import compute_share, placement
from gpu_broker.inventory import DeviceInfo
from service_kit.units import format_bytes
from service_kit.auth import ANONYMOUS, Caller
from service_kit.errors import (
    Aborted,
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
)

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Holder:
    client_id: str
    purpose: str = ""
    priority: int = 0
    pid: int = 0  # its process on this host, whose device memory (children included) counts against the lease

    def describe(self) -> str:
        purpose = f", {self.purpose!r}" if self.purpose else ""
        return f"{self.client_id!r} (priority {self.priority}{purpose})"


@dataclass(frozen=True)
class AcquireSpec:
    holder: Holder
    memory_bytes: int = 0  # 0 = the whole device, exclusively
    device_index: int | None = None
    fail_fast: bool = False
    release_grace_s: float | None = None  # None = the broker's default
    owner: str = ANONYMOUS.identity  # the authenticated identity that asked; only it (or an admin) may end it
    reclaim_lease_id: str = ""  # the lease this holder held before the broker restarted
    batch: bool = False  # throughput work (training): yields compute to busy interactive holders on its device


class LeaseState(Enum):
    ACTIVE = "active"
    PREEMPTING = "preempting"
    AWAITING_RECLAIM = "awaiting_reclaim"  # restored from the journal; no stream holds it yet


class WaitState(Enum):
    QUEUED = "queued"
    PREEMPTING = "preempting"


@dataclass
class LeaseRecord:
    lease_id: str
    request_id: str
    holder: Holder
    device_index: int
    memory_bytes: int
    exclusive: bool
    granted_at: float
    granted_priority: int
    release_grace_s: float
    owner: str = ANONYMOUS.identity
    state: LeaseState = LeaseState.ACTIVE
    preempt_deadline: float | None = None
    preempt_for: str | None = None
    missed_preempt_deadlines: int = 0
    reclaim_deadline: float | None = None  # AWAITING_RECLAIM: freed at this time unless re-claimed
    over_lease: bool = False  # its processes were last seen using more than it holds
    batch: bool = False  # throughput work: yields compute between its steps (gpu_broker.compute_share)
    busy: bool = False  # interactive work said to be under way (SetBusy); never journaled
    yielding_to: str = ""  # while a batch lease yields: the busy lease it yields to


@dataclass
class Waiter:
    request_id: str
    spec: AcquireSpec
    arrived_at: float
    arrival: int
    release_grace_s: float
    state: WaitState = WaitState.QUEUED
    device_index: int | None = None
    victims: tuple[str, ...] = ()
    deadline: float | None = None
    notified_position: int | None = None
    effective_priority: int = 0  # the priority plus queue aging, as of the last aging step (its queue key)


# What a stream hears. `request_id` names the Acquire stream it goes to.
@dataclass(frozen=True)
class Queued:
    position: int
    reason: str


@dataclass(frozen=True)
class Preempting:
    device_index: int
    victims: tuple[str, ...]
    deadline: float


@dataclass(frozen=True)
class Granted:
    lease: LeaseRecord


@dataclass(frozen=True)
class PreemptRequested:
    lease_id: str
    deadline: float
    for_request_id: str
    for_holder: Holder


@dataclass(frozen=True)
class PreemptWithdrawn:
    lease_id: str
    reason: str


@dataclass(frozen=True)
class AbortRequested:
    lease_id: str
    reason: str


@dataclass(frozen=True)
class YieldRequested:
    lease_id: str
    for_lease_id: str
    for_holder: Holder


@dataclass(frozen=True)
class YieldWithdrawn:
    lease_id: str
    reason: str


@dataclass(frozen=True)
class Released:
    lease: LeaseRecord
    held_s: float


@dataclass(frozen=True)
class Ended:
    """The stream ends: cleanly when error is None, else with that error's status."""

    error: ServiceError | None = None


StreamEvent = (Queued | Preempting | Granted | PreemptRequested | PreemptWithdrawn | AbortRequested | YieldRequested
               | YieldWithdrawn | Released | Ended)


@dataclass(frozen=True)
class Notice:
    request_id: str
    event: StreamEvent
    time: float


class TransitionKind(Enum):
    QUEUED = "queued"
    REJECTED = "rejected"
    GRANTED = "granted"
    PREEMPT_REQUESTED = "preempt_requested"
    PREEMPT_WITHDRAWN = "preempt_withdrawn"
    PREEMPT_DEADLINE_MISSED = "preempt_deadline_missed"
    RELEASED = "released"
    HOLDER_LOST = "holder_lost"
    CANCELLED = "cancelled"
    ABORT_REQUESTED = "abort_requested"
    FAILED = "failed"
    AWAITING_RECLAIM = "awaiting_reclaim"
    RECLAIM_EXPIRED = "reclaim_expired"
    OVER_LEASE = "over_lease"
    YIELD_REQUESTED = "yield_requested"
    YIELD_WITHDRAWN = "yield_withdrawn"


@dataclass(frozen=True)
class Transition:
    sequence: int
    time: float
    kind: TransitionKind
    request_id: str = ""
    lease_id: str = ""
    holder: Holder | None = None
    device_index: int = -1
    detail: str = ""


@dataclass(frozen=True)
class WaiterSnapshot:
    waiter: Waiter
    position: int
    effective_priority: int


@dataclass(frozen=True)
class Snapshot:
    devices: tuple[DeviceInfo, ...]
    leased_bytes: dict[int, int]
    leases: tuple[LeaseRecord, ...]
    queue: tuple[WaiterSnapshot, ...]
    sequence: int


class CancelOutcome(Enum):
    REMOVED_FROM_QUEUE = "removed_from_queue"
    ABORT_REQUESTED = "abort_requested"


@dataclass
class BrokerPolicy:
    default_release_grace_s: float = 10.0
    max_release_grace_s: float = 600.0
    # Each full interval a request waits adds 1 to its queue priority, so no request starves.
    aging_interval_s: float = 30.0
    # Requests that may wait at once; more answer RESOURCE_EXHAUSTED (every queue operation costs per waiter).
    max_waiters: int = 1024
    # After a restart, how long leases read from the journal stay set aside for their holders to re-claim.
    # Longer than a holder needs to notice the broker is back (its client retries within a second) and than
    # a holder that will not re-claim needs to stop using the memory (a training job checkpoints first).
    reclaim_window_s: float = 60.0
    # Queue positions that moved are told at most this often: one pass over the queue per interval, not one
    # per operation (a mass disconnect would otherwise cost the queue's length squared).
    position_notice_s: float = 0.25


class LeaseBook:
    def __init__(self, devices: list[DeviceInfo], policy: BrokerPolicy | None = None):
        self.devices = tuple(devices)
        self.policy = policy or BrokerPolicy()
        self._leases: dict[str, LeaseRecord] = {}
        self._lease_of_request: dict[str, str] = {}
        self._waiters: dict[str, Waiter] = {}
        # The queue in rank order (effective priority, then arrival): O(log n) to add, remove and locate.
        self._queue = SortedKeyList(key=lambda w: (-w.effective_priority, w.arrival))
        self._aging: list[tuple[float, int, str]] = []  # heap of (next aging step, arrival, request id)
        self._preempting: set[str] = set()  # waiters in the PREEMPTING state
        self._positions_due: float | None = None  # when moved queue positions are next told
        self._arrivals = 0
        self._sequence = 0
        self.outbox: list[Notice] = []
        self.transitions: list[Transition] = []

    # ---- operations -------------------------------------------------------------------

    def restore(self, leases: list[LeaseRecord], now: float) -> None:
        """At start: the leases the journal says were held when the broker went away. Their holders may still
        be using the memory, so it stays theirs until they re-claim it or the re-claim window ends."""
        deadline = now + self.policy.reclaim_window_s
        for lease in leases:
            if not 0 <= lease.device_index < len(self.devices):
                continue  # the inventory changed: nothing to keep on a device that is gone
            restored = replace(lease, request_id="", state=LeaseState.AWAITING_RECLAIM, preempt_deadline=None,
                               preempt_for=None, reclaim_deadline=deadline, busy=False, yielding_to="")
            self._leases[restored.lease_id] = restored
            self._transition(now, TransitionKind.AWAITING_RECLAIM, lease_id=restored.lease_id, holder=restored.holder,
                             device_index=restored.device_index,
                             detail=f"{format_bytes(restored.memory_bytes)} kept for its holder to re-claim within "
                                    f"{self.policy.reclaim_window_s:g}s")

    def submit(self, spec: AcquireSpec, now: float) -> str:
        """Validates and enqueues a request; returns its id. Raises without changing anything."""
        request_id = "req-" + uuid.uuid4().hex[:12]
        if spec.reclaim_lease_id and self._reclaimable(spec):
            self._validate(spec)
            self._reclaim(self._leases[spec.reclaim_lease_id], request_id, spec, now)
            return request_id
        self._age(now)
        try:
            if len(self._waiters) >= self.policy.max_waiters:
                raise ResourceExhausted(f"{len(self._waiters)} requests are already waiting (the most this broker "
                                        "queues); retry later", reason="QUEUE_FULL")
            grace = self._validate(spec)
            waiter = Waiter(request_id, spec, now, self._arrivals, grace,
                            effective_priority=min(INT32_MAX, spec.holder.priority))
            self._enqueue(waiter, age=False)  # planned as if queued: whether it would be granted or preempt
            try:
                plan = self._plan(now)
            finally:
                self._dequeue(waiter)
            if spec.fail_fast and not plan.touches(request_id):
                raise ResourceExhausted(
                    f"cannot grant {self._describe_need(spec)} now and wait_policy is FAIL_FAST: "
                    f"{self._why_blocked(spec)}; no holder was disturbed",
                    reason="WOULD_HAVE_TO_WAIT", metadata={"client_id": spec.holder.client_id})
        except ServiceError as err:
            self._transition(now, TransitionKind.REJECTED, request_id=request_id, holder=spec.holder, detail=err.message)
            raise
        self._arrivals += 1
        self._enqueue(waiter)
        first_notice = len(self.outbox)
        self._apply(plan, now)
        still_waiting = request_id in self._waiters
        position = self._queue.index(waiter) if still_waiting else 0
        reason = self._why_blocked(spec, exclude=request_id) if still_waiting else "fits now"
        self.outbox.insert(first_notice, Notice(request_id, Queued(position, reason), now))
        if still_waiting:
            waiter.notified_position = position
            if waiter.state is WaitState.QUEUED:
                self._transition(now, TransitionKind.QUEUED, request_id=request_id, holder=spec.holder,
                                 device_index=-1 if spec.device_index is None else spec.device_index,
                                 detail=f"position {position}: {reason}")
            if position < len(self._queue) - 1:  # it went ahead of someone: their positions moved
                self._positions_moved(now)
        return request_id

    def release(self, lease_id: str, now: float, caller: Caller = ANONYMOUS) -> Released:
        if not lease_id:
            raise InvalidArgument("lease_id is required", reason="MISSING_LEASE_ID")
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"no live lease {lease_id!r}; it was never granted or is already released",
                           reason="LEASE_NOT_FOUND", metadata={"lease_id": lease_id})
        _check_owner(caller, lease.owner, f"lease {lease_id}")
        released = self._free(lease, now, TransitionKind.RELEASED, "released by holder")
        if lease.request_id:  # a lease awaiting re-claim has no stream
            self.outbox.append(Notice(lease.request_id, released, now))
            self.outbox.append(Notice(lease.request_id, Ended(), now))
        self._schedule(now)
        return released

    def stream_closed(self, request_id: str, now: float) -> None:
        """The Acquire stream is gone (caller cancelled, process died, deadline): free what it held."""
        self._age(now)
        if request_id in self._waiters:
            self._remove_waiter(self._waiters[request_id], now, TransitionKind.CANCELLED, "caller went away")
        elif request_id in self._lease_of_request:
            lease = self._leases[self._lease_of_request[request_id]]
            self._free(lease, now, TransitionKind.HOLDER_LOST, "holder stream closed; lease freed")
        else:
            return
        self._schedule(now)

    def cancel(self, now: float, *, request_id: str = "", lease_id: str = "", reason: str = "",
               caller: Caller = ANONYMOUS) -> CancelOutcome:
        if not request_id and not lease_id:
            raise InvalidArgument("Cancel needs a request_id or a lease_id", reason="MISSING_TARGET")
        self._age(now)
        if request_id and request_id in self._waiters:
            waiter = self._waiters[request_id]
            _check_owner(caller, waiter.spec.owner, f"request {request_id}")
            why = reason or "cancelled"
            self._remove_waiter(waiter, now, TransitionKind.CANCELLED, why)
            self.outbox.append(Notice(request_id, Ended(Cancelled(
                f"request {request_id} was cancelled while waiting: {why}", reason="REQUEST_CANCELLED")), now))
            self._schedule(now)
            return CancelOutcome.REMOVED_FROM_QUEUE
        if request_id:
            lease_id = self._lease_of_request.get(request_id, "")
            if not lease_id:
                raise NotFound(f"no waiting request or live lease for request {request_id!r}",
                               reason="REQUEST_NOT_FOUND", metadata={"request_id": request_id})
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"no live lease {lease_id!r}", reason="LEASE_NOT_FOUND", metadata={"lease_id": lease_id})
        _check_owner(caller, lease.owner, f"lease {lease_id}")
        why = reason or "abort requested"
        if lease.state is LeaseState.AWAITING_RECLAIM:  # nothing runs under it that could abort: free it
            self._free(lease, now, TransitionKind.CANCELLED, f"cancelled while awaiting re-claim: {why}")
            self._schedule(now)
            return CancelOutcome.REMOVED_FROM_QUEUE
        self.outbox.append(Notice(lease.request_id, AbortRequested(lease.lease_id, why), now))
        self._transition(now, TransitionKind.ABORT_REQUESTED, request_id=lease.request_id, lease_id=lease.lease_id,
                         holder=lease.holder, device_index=lease.device_index, detail=why)
        return CancelOutcome.ABORT_REQUESTED

    def set_busy(self, lease_id: str, busy: bool, now: float, caller: Caller = ANONYMOUS) -> tuple[str, ...]:
        """An interactive holder says whether its latency-sensitive work is under way; the batch leases on its device
        that must yield (or may resume) hear it. Returns the leases that yield to it now."""
        if not lease_id:
            raise InvalidArgument("lease_id is required", reason="MISSING_LEASE_ID")
        lease = self._leases.get(lease_id)
        if lease is None:
            raise NotFound(f"no live lease {lease_id!r}; it was never granted or is already released",
                           reason="LEASE_NOT_FOUND", metadata={"lease_id": lease_id})
        _check_owner(caller, lease.owner, f"lease {lease_id}")
        if lease.state is LeaseState.AWAITING_RECLAIM:
            raise FailedPrecondition(f"lease {lease_id} awaits re-claim after a broker restart; re-claim it "
                                     "(Acquire with reclaim_lease_id) before saying it is busy",
                                     reason="LEASE_AWAITING_RECLAIM")
        if lease.batch:
            raise FailedPrecondition(f"lease {lease_id} is batch work (COMPUTE_CLASS_BATCH): only an interactive "
                                     "lease is busy for others to yield to", reason="BATCH_LEASE_NOT_BUSY")
        lease.busy = busy
        self._share(now)
        return tuple(sorted(x.lease_id for x in self._leases.values() if x.yielding_to == lease_id))

    def tick(self, now: float) -> None:
        """Fails preemptions whose victims missed their deadline, frees journaled leases nobody re-claimed in
        time, and re-ranks the aged queue."""
        for lease in [x for x in self._leases.values() if x.state is LeaseState.AWAITING_RECLAIM
                      and x.reclaim_deadline is not None and x.reclaim_deadline <= now]:
            self._free(lease, now, TransitionKind.RECLAIM_EXPIRED,
                       f"not re-claimed within {self.policy.reclaim_window_s:g}s of the broker's start; freed")
        self._age(now)
        if self._positions_due is not None and self._positions_due <= now:
            self._positions_due = None
            self._notify_positions(now)
        for waiter in [self._waiters[r] for r in list(self._preempting)]:
            overdue = [self._leases[v] for v in waiter.victims
                       if v in self._leases and self._leases[v].preempt_deadline is not None
                       and self._leases[v].preempt_deadline <= now]
            if overdue:
                self._fail_preemption(waiter, overdue, now)
        self._schedule(now)

    def shutdown(self, now: float, error: ServiceError) -> None:
        """Ends every stream with `error`; the broker is going away."""
        for waiter in list(self._waiters.values()):
            self._remove_waiter(waiter, now, TransitionKind.FAILED, error.message)
            self.outbox.append(Notice(waiter.request_id, Ended(error), now))
        for lease in list(self._leases.values()):
            self._free(lease, now, TransitionKind.HOLDER_LOST, error.message)
            self.outbox.append(Notice(lease.request_id, Ended(error), now))

    def next_deadline(self, now: float) -> float | None:
        """When `tick` next has work: the nearest preempt deadline or aging step."""
        times = [lease.preempt_deadline for lease in self._leases.values() if lease.preempt_deadline is not None]
        times += [lease.reclaim_deadline for lease in self._leases.values() if lease.reclaim_deadline is not None]
        while self._aging and self._stale(self._aging[0]):
            heapq.heappop(self._aging)
        if self._aging:
            times.append(self._aging[0][0])
        if self._positions_due is not None:
            times.append(self._positions_due)
        return min(times) if times else None

    def snapshot(self, now: float) -> Snapshot:
        leased = {d.index: 0 for d in self.devices}
        for lease in self._leases.values():
            leased[lease.device_index] += lease.memory_bytes
        self._age(now)
        queue = tuple(WaiterSnapshot(replace(w), i, w.effective_priority) for i, w in enumerate(self._queue))
        leases = tuple(replace(lease) for lease in sorted(self._leases.values(), key=lambda x: x.granted_at))
        return Snapshot(self.devices, leased, leases, queue, self._sequence)

    def live(self) -> tuple[list[LeaseRecord], int]:
        """The leases and the queue's length as they stand, without aging anyone (for metrics)."""
        return list(self._leases.values()), len(self._queue)

    def report_usage(self, used: dict[str, int], now: float) -> None:
        """What each lease's processes use on the device (lease id -> bytes, measured): a lease whose holder
        crosses above what it holds is said once on the timeline, and again only after it went back under."""
        for lease_id, used_bytes in used.items():
            lease = self._leases.get(lease_id)
            if lease is None:
                continue
            over = used_bytes > lease.memory_bytes
            if over and not lease.over_lease:
                self._transition(now, TransitionKind.OVER_LEASE, request_id=lease.request_id, lease_id=lease_id,
                                 holder=lease.holder, device_index=lease.device_index,
                                 detail=f"its processes use {format_bytes(used_bytes)} of the device; the lease "
                                        f"holds {format_bytes(lease.memory_bytes)}")
            lease.over_lease = over

    def journal(self) -> list[dict]:
        """What a restarted broker needs to keep for the holders: every lease, awaiting re-claim or not."""
        return [{"lease_id": x.lease_id, "client_id": x.holder.client_id, "purpose": x.holder.purpose,
                 "priority": x.holder.priority, "pid": x.holder.pid, "device_index": x.device_index, "memory_bytes": x.memory_bytes,
                 "exclusive": x.exclusive, "granted_at": x.granted_at, "granted_priority": x.granted_priority,
                 "release_grace_s": x.release_grace_s, "owner": x.owner, "batch": x.batch}
                for x in sorted(self._leases.values(), key=lambda x: x.lease_id)]

    @staticmethod
    def leases_from_journal(entries: list[dict]) -> list[LeaseRecord]:
        return [LeaseRecord(lease_id=e["lease_id"], request_id="",
                            holder=Holder(e["client_id"], e.get("purpose", ""), e.get("priority", 0), e.get("pid", 0)),
                            device_index=e["device_index"], memory_bytes=e["memory_bytes"], exclusive=e["exclusive"],
                            granted_at=e["granted_at"], granted_priority=e["granted_priority"],
                            release_grace_s=e["release_grace_s"], owner=e["owner"], batch=e.get("batch", False))
                for e in entries]

    def lease_for_request(self, request_id: str) -> LeaseRecord | None:
        lease_id = self._lease_of_request.get(request_id)
        return None if lease_id is None else self._leases[lease_id]

    # ---- validation ---------------------------------------------------------------------

    def _validate(self, spec: AcquireSpec) -> float:
        if not spec.holder.client_id.strip():
            raise InvalidArgument("holder.client_id is required: name the calling service instance, e.g. 'inference-0'",
                                  reason="MISSING_CLIENT_ID")
        if spec.memory_bytes < 0:
            raise InvalidArgument(f"memory_bytes must be >= 0 (0 asks for the whole device), got {spec.memory_bytes}",
                                  reason="NEGATIVE_MEMORY")
        grace = self.policy.default_release_grace_s if spec.release_grace_s is None else spec.release_grace_s
        if grace < 0 or grace > self.policy.max_release_grace_s:
            raise InvalidArgument(
                f"release_grace must be between 0 and {self.policy.max_release_grace_s:g}s, got {grace:g}s",
                reason="BAD_RELEASE_GRACE")
        if not self.devices:
            raise FailedPrecondition("this broker has no devices to lease (no GPU found and no --fake-devices given)",
                                     reason="NO_DEVICES")
        if spec.device_index is not None and not 0 <= spec.device_index < len(self.devices):
            raise InvalidArgument(
                f"device_index {spec.device_index} does not exist; this broker has devices 0..{len(self.devices) - 1}",
                reason="UNKNOWN_DEVICE", metadata={"device_index": str(spec.device_index)})
        pool = self.devices if spec.device_index is None else [self.devices[spec.device_index]]
        if spec.memory_bytes > max(d.total_bytes for d in pool):
            where = "the largest device" if spec.device_index is None else f"device {spec.device_index}"
            raise ResourceExhausted(
                f"{format_bytes(spec.memory_bytes)} can never fit: {where} has {format_bytes(max(d.total_bytes for d in pool))}",
                reason="NEVER_FITS", metadata={"memory_bytes": str(spec.memory_bytes)})
        return grace

    def _reclaimable(self, spec: AcquireSpec) -> bool:
        """The journaled lease a request names is still set aside, and the request is its holder's."""
        lease = self._leases.get(spec.reclaim_lease_id)
        return (lease is not None and lease.state is LeaseState.AWAITING_RECLAIM and lease.owner == spec.owner
                and lease.holder.client_id == spec.holder.client_id
                and spec.device_index in (None, lease.device_index)
                and (spec.memory_bytes == 0 if lease.exclusive else spec.memory_bytes == lease.memory_bytes))

    def _reclaim(self, lease: LeaseRecord, request_id: str, spec: AcquireSpec, now: float) -> None:
        """Gives a journaled lease back to its holder at once: same id, device and budget, ahead of any waiter."""
        lease.request_id, lease.state, lease.reclaim_deadline = request_id, LeaseState.ACTIVE, None
        lease.holder = spec.holder
        self._lease_of_request[request_id] = lease.lease_id
        self.outbox.append(Notice(request_id, Queued(0, "re-claiming a lease held before the broker restarted"), now))
        self.outbox.append(Notice(request_id, Granted(replace(lease)), now))
        self._transition(now, TransitionKind.GRANTED, request_id=request_id, lease_id=lease.lease_id,
                         holder=lease.holder, device_index=lease.device_index,
                         detail=f"{format_bytes(lease.memory_bytes)} re-claimed after a broker restart")
        self._share(now)

    def _describe_need(self, spec: AcquireSpec) -> str:
        what = "the whole device" if spec.memory_bytes == 0 else format_bytes(spec.memory_bytes)
        where = "any device" if spec.device_index is None else f"device {spec.device_index}"
        return f"{what} on {where}"

    def _why_blocked(self, spec: AcquireSpec, exclude: str = "") -> str:
        pool = self.devices if spec.device_index is None else [self.devices[spec.device_index]]
        parts = []
        for dev in pool:
            holders = [lease for lease in self._leases.values() if lease.device_index == dev.index]
            free = dev.total_bytes - sum(lease.memory_bytes for lease in holders)
            who = ", ".join(f"{lease.holder.client_id} (priority {lease.granted_priority}, "
                            f"{format_bytes(lease.memory_bytes)}"
                            f"{', awaiting re-claim' if lease.state is LeaseState.AWAITING_RECLAIM else ''})"
                            for lease in holders) or "no holders"
            parts.append(f"device {dev.index} has {format_bytes(free)} free, held by {who}")
        waiting = len(self._waiters) - (1 if exclude in self._waiters else 0)
        tail = f"; {waiting} other request(s) waiting" if waiting else ""
        return "; ".join(parts) + tail

    # ---- scheduling ---------------------------------------------------------------------

    def _effective_priority(self, waiter: Waiter, now: float) -> int:
        aging = self.policy.aging_interval_s
        bonus = int((now - waiter.arrived_at) // aging) if aging > 0 else 0
        return min(INT32_MAX, waiter.spec.holder.priority + max(0, bonus))

    @staticmethod
    def _view(w: Waiter) -> placement.WaiterView:
        return placement.WaiterView(
            request_id=w.request_id, priority=w.spec.holder.priority, effective_priority=w.effective_priority,
            arrival=w.arrival, memory_bytes=w.spec.memory_bytes, device_index=w.spec.device_index,
            preempting_device=w.device_index if w.state is WaitState.PREEMPTING else None, victims=w.victims)

    def _plan(self, now: float) -> placement.Plan:
        devices = [placement.DeviceView(d.index, d.total_bytes) for d in self.devices]
        leases = [
            # A lease awaiting re-claim cannot be asked to release (nobody would hear it): never a victim.
            placement.LeaseView(lease.lease_id, lease.device_index, lease.memory_bytes,
                                INT32_MAX if lease.state is LeaseState.AWAITING_RECLAIM else lease.granted_priority,
                                preempting=lease.state is LeaseState.PREEMPTING)
            for lease in self._leases.values()
        ]
        return placement.plan_schedule(
            devices, leases, (self._view(w) for w in self._queue), ranked=True,
            preempting_later=lambda: [self._view(self._waiters[r]) for r in self._preempting])

    def _schedule(self, now: float) -> None:
        self._apply(self._plan(now), now)

    def _apply(self, plan: placement.Plan, now: float) -> None:
        for request_id in plan.requeued:
            waiter = self._waiters[request_id]
            waiter.state, waiter.device_index, waiter.victims, waiter.deadline = WaitState.QUEUED, None, (), None
            self._preempting.discard(request_id)
            waiter.notified_position = None  # told its place again at the next position notice
            self._positions_moved(now)
        for request_id, device_index in plan.grants:
            self._grant(self._waiters[request_id], device_index, now)
        for pre in plan.preemptions:
            self._start_preemption(self._waiters[pre.request_id], pre, now)

    def _grant(self, waiter: Waiter, device_index: int, now: float) -> None:
        self._withdraw_victims(waiter, now, "the waiter was granted without them")
        self._dequeue(waiter)
        self._positions_moved(now)
        dev = self.devices[device_index]
        exclusive = waiter.spec.memory_bytes == 0
        lease = LeaseRecord(
            lease_id="lease-" + uuid.uuid4().hex[:12],
            request_id=waiter.request_id,
            holder=waiter.spec.holder,
            device_index=device_index,
            memory_bytes=dev.total_bytes if exclusive else waiter.spec.memory_bytes,
            exclusive=exclusive,
            granted_at=now,
            granted_priority=self._effective_priority(waiter, now),
            release_grace_s=waiter.release_grace_s,
            owner=waiter.spec.owner,
            batch=waiter.spec.batch,
        )
        self._leases[lease.lease_id] = lease
        self._lease_of_request[waiter.request_id] = lease.lease_id
        self.outbox.append(Notice(waiter.request_id, Granted(replace(lease)), now))
        self._transition(now, TransitionKind.GRANTED, request_id=waiter.request_id, lease_id=lease.lease_id,
                         holder=lease.holder, device_index=device_index,
                         detail=f"{format_bytes(lease.memory_bytes)}{' exclusive' if exclusive else ''} "
                                f"after {now - waiter.arrived_at:.3f}s")
        self._share(now)  # after its Granted notice: a batch lease granted beside busy work hears it must yield

    def _start_preemption(self, waiter: Waiter, pre: placement.Preemption, now: float) -> None:
        waiter.state, waiter.device_index, waiter.victims = WaitState.PREEMPTING, pre.device_index, pre.victims
        self._preempting.add(waiter.request_id)
        deadlines = []
        for lease_id in pre.victims:
            lease = self._leases[lease_id]
            lease.state = LeaseState.PREEMPTING
            lease.preempt_deadline = now + lease.release_grace_s
            lease.preempt_for = waiter.request_id
            deadlines.append(lease.preempt_deadline)
            self.outbox.append(Notice(lease.request_id, PreemptRequested(
                lease_id, lease.preempt_deadline, waiter.request_id, waiter.spec.holder), now))
            self._transition(now, TransitionKind.PREEMPT_REQUESTED, request_id=lease.request_id, lease_id=lease_id,
                             holder=lease.holder, device_index=lease.device_index,
                             detail=f"for {waiter.spec.holder.describe()} ({waiter.request_id}); "
                                    f"release within {lease.release_grace_s:g}s")
        waiter.deadline = max(deadlines)
        self.outbox.append(Notice(waiter.request_id, Preempting(pre.device_index, pre.victims, waiter.deadline), now))

    def _fail_preemption(self, waiter: Waiter, overdue: list[LeaseRecord], now: float) -> None:
        names = ", ".join(f"{lease.holder.describe()} holding {lease.lease_id}" for lease in overdue)
        for lease in overdue:
            lease.missed_preempt_deadlines += 1
            self._transition(now, TransitionKind.PREEMPT_DEADLINE_MISSED, request_id=lease.request_id,
                             lease_id=lease.lease_id, holder=lease.holder, device_index=lease.device_index,
                             detail=f"did not release within {lease.release_grace_s:g}s for {waiter.request_id}")
        message = (f"preemption failed: {names} did not release by its deadline; nothing was granted "
                   f"on top of it. Retry later or ask the operator to stop that holder")
        error = Aborted(message, reason="PREEMPT_DEADLINE_MISSED",
                        metadata={"holders": ",".join(lease.holder.client_id for lease in overdue),
                                  "leases": ",".join(lease.lease_id for lease in overdue)})
        self._remove_waiter(waiter, now, TransitionKind.FAILED, message)
        self.outbox.append(Notice(waiter.request_id, Ended(error), now))

    def _withdraw_victims(self, waiter: Waiter, now: float, reason: str) -> None:
        for lease_id in waiter.victims:
            lease = self._leases.get(lease_id)
            if lease is None or lease.preempt_for != waiter.request_id:
                continue
            lease.state, lease.preempt_deadline, lease.preempt_for = LeaseState.ACTIVE, None, None
            self.outbox.append(Notice(lease.request_id, PreemptWithdrawn(lease_id, reason), now))
            self._transition(now, TransitionKind.PREEMPT_WITHDRAWN, request_id=lease.request_id, lease_id=lease_id,
                             holder=lease.holder, device_index=lease.device_index, detail=reason)

    def _remove_waiter(self, waiter: Waiter, now: float, kind: TransitionKind, detail: str) -> None:
        self._withdraw_victims(waiter, now, f"the request it was preempted for is gone ({detail})")
        self._dequeue(waiter)
        self._positions_moved(now)
        self._transition(now, kind, request_id=waiter.request_id, holder=waiter.spec.holder,
                         device_index=-1 if waiter.device_index is None else waiter.device_index, detail=detail)

    def _free(self, lease: LeaseRecord, now: float, kind: TransitionKind, detail: str) -> Released:
        del self._leases[lease.lease_id]
        self._lease_of_request.pop(lease.request_id, None)
        held = now - lease.granted_at
        self._transition(now, kind, request_id=lease.request_id, lease_id=lease.lease_id, holder=lease.holder,
                         device_index=lease.device_index, detail=f"{detail} after {held:.3f}s")
        if lease.busy:
            self._share(now)  # the batch work that yielded to it resumes
        return Released(replace(lease), held)

    def _share(self, now: float) -> None:
        """Tells each batch lease whose yielding changed (gpu_broker.compute_share): to yield, to whom, or to resume.
        A lease awaiting re-claim has no stream and no work under the broker's eye: it neither yields nor is busy."""
        live = [x for x in self._leases.values() if x.state is not LeaseState.AWAITING_RECLAIM]
        wanted = compute_share.yields(compute_share.ShareView(x.lease_id, x.device_index, x.holder.priority, x.batch,
                                                              x.busy) for x in live)
        for lease in live:
            to = wanted.get(lease.lease_id, "")
            if to == lease.yielding_to:
                continue
            previous, lease.yielding_to = lease.yielding_to, to
            if to:
                busy = self._leases[to]
                self.outbox.append(Notice(lease.request_id, YieldRequested(lease.lease_id, to, busy.holder), now))
                self._transition(now, TransitionKind.YIELD_REQUESTED, request_id=lease.request_id,
                                 lease_id=lease.lease_id, holder=lease.holder, device_index=lease.device_index,
                                 detail=f"yield compute between steps to {busy.holder.describe()} ({to}), busy on "
                                        f"device {lease.device_index}")
            else:
                gone = "was released" if previous not in self._leases else "is no longer busy"
                reason = f"{previous} {gone} on device {lease.device_index}"
                self.outbox.append(Notice(lease.request_id, YieldWithdrawn(lease.lease_id, reason), now))
                self._transition(now, TransitionKind.YIELD_WITHDRAWN, request_id=lease.request_id,
                                 lease_id=lease.lease_id, holder=lease.holder, device_index=lease.device_index,
                                 detail=reason)

    def _notify_positions(self, now: float) -> None:
        """One pass over the queue: each waiter whose place changed since it was last told hears it."""
        for i, waiter in enumerate(self._queue):
            if waiter.state is WaitState.QUEUED and waiter.notified_position != i:
                waiter.notified_position = i
                self.outbox.append(Notice(waiter.request_id, Queued(i, "queue moved"), now))

    def _positions_moved(self, now: float) -> None:
        """Positions changed: they are told at the next notice time, once, however many changes came first."""
        if self._positions_due is None and self._queue:
            self._positions_due = now + self.policy.position_notice_s

    # ---- the queue ------------------------------------------------------------------------------

    def _enqueue(self, waiter: Waiter, age: bool = True) -> None:
        self._waiters[waiter.request_id] = waiter
        self._queue.add(waiter)
        aging = self.policy.aging_interval_s
        if age and aging > 0:
            heapq.heappush(self._aging, (waiter.arrived_at + aging, waiter.arrival, waiter.request_id))

    def _dequeue(self, waiter: Waiter) -> None:
        del self._waiters[waiter.request_id]
        self._queue.remove(waiter)
        self._preempting.discard(waiter.request_id)

    def _stale(self, entry: tuple[float, int, str]) -> bool:
        waiter = self._waiters.get(entry[2])
        return waiter is None or waiter.arrival != entry[1]

    def _age(self, now: float) -> None:
        """Applies every aging step due by `now`: each one re-ranks one waiter (O(log n))."""
        aging = self.policy.aging_interval_s
        while self._aging and self._aging[0][0] <= now:
            entry = heapq.heappop(self._aging)
            if self._stale(entry):
                continue
            waiter = self._waiters[entry[2]]
            priority = self._effective_priority(waiter, now)
            if priority != waiter.effective_priority:
                self._queue.remove(waiter)
                waiter.effective_priority = priority
                self._queue.add(waiter)
                self._positions_moved(now)
            if priority < INT32_MAX:
                steps = math.floor((now - waiter.arrived_at) / aging) + 1
                due = waiter.arrived_at + aging * steps
                while due <= now:  # the division can round one step short: the next step must lie after now
                    steps += 1
                    due = waiter.arrived_at + aging * steps
                heapq.heappush(self._aging, (due, entry[1], entry[2]))

    def _transition(self, now: float, kind: TransitionKind, **fields) -> None:
        self._sequence += 1
        self.transitions.append(Transition(self._sequence, now, kind, **fields))


def _check_owner(caller: Caller, owner: str, what: str) -> None:
    """Only the identity that acquired a lease (or an admin) may end it: ids are visible in Status."""
    if not caller.may_act_on(owner):
        raise PermissionDenied(f"{what} belongs to {owner!r}; only it or an admin may release or cancel it",
                               reason="NOT_OWNER", metadata={"owner": owner})
