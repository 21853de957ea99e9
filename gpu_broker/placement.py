"""Which waiting request gets which device, and whom to preempt for it: a pure function of the state.

The rules (docs/architecture.md places them among the other policies):
- Waiters are served by effective priority (priority plus queue aging), then arrival.
- A waiter that fits is granted on the device where it fits most tightly.
- A waiter that does not fit may preempt holders of strictly lower priority, but only
  when evicting them makes it fit; the smallest such set of victims is chosen.
- A waiter that can do neither reserves memory on the device closest to fitting and
  claims it, so later waiters can neither take that memory nor evict holders there
  for memory it would take first. This is what keeps big requests from starving.
Nothing here mutates: `plan_schedule` returns what the lease book should do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class DeviceView:
    index: int
    total_bytes: int


@dataclass(frozen=True)
class LeaseView:
    lease_id: str
    device_index: int
    memory_bytes: int
    priority: int
    # Already asked to release for another waiter: its memory is spoken for.
    preempting: bool = False


@dataclass(frozen=True)
class WaiterView:
    request_id: str
    priority: int
    effective_priority: int
    arrival: int
    memory_bytes: int  # 0 = the whole device
    device_index: int | None = None
    preempting_device: int | None = None
    victims: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preemption:
    request_id: str
    device_index: int
    victims: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    grants: tuple[tuple[str, int], ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    # Waiters whose preemption is over (victims gone) but who still do not fit: back to queued.
    requeued: tuple[str, ...] = ()
    # Every still-waiting request in queue order.
    waiting_order: tuple[str, ...] = ()

    def touches(self, request_id: str) -> bool:
        return any(r == request_id for r, _ in self.grants) or any(p.request_id == request_id for p in self.preemptions)


def need_on(waiter: WaiterView, device: DeviceView) -> int:
    return device.total_bytes if waiter.memory_bytes == 0 else waiter.memory_bytes


def candidate_devices(waiter: WaiterView, devices: list[DeviceView]) -> list[DeviceView]:
    """Devices the waiter could ever fit on."""
    pool = devices if waiter.device_index is None else [d for d in devices if d.index == waiter.device_index]
    return [d for d in pool if need_on(waiter, d) <= d.total_bytes]


def rank(waiters: list[WaiterView]) -> list[WaiterView]:
    return sorted(waiters, key=lambda w: (-w.effective_priority, w.arrival))


def plan_schedule(devices: list[DeviceView], leases: list[LeaseView], waiters, *, ranked: bool = False,
                  preempting_later: Callable[[], list[WaiterView]] | None = None) -> Plan:
    """The plan for `waiters` (any order, or already in rank order with `ranked`, then possibly a lazy iterable).

    Once every device is claimed by a blocked waiter and has nothing left, no later waiter can be granted,
    claim or preempt: the scan stops there (so a long queue costs its head, not its length). What it would
    still have done is requeue later waiters whose preemption is over; `preempting_later` gives the ones in
    the preempting state, so they are handled all the same. Without it the whole queue is scanned, and
    `waiting_order` then lists every still-waiting request; after an early stop it lists the scanned ones.
    """
    by_index = {d.index: d for d in devices}
    live = {lease.lease_id: lease for lease in leases}
    avail = {d.index: d.total_bytes for d in devices}
    for lease in leases:
        avail[lease.device_index] -= lease.memory_bytes
    taken = {lease.lease_id for lease in leases if lease.preempting}
    claimed: set[int] = set()
    grants: list[tuple[str, int]] = []
    preemptions: list[Preemption] = []
    requeued: list[str] = []
    waiting: list[str] = []

    scanned: set[str] = set()
    for w in (waiters if ranked else rank(list(waiters))):
        if preempting_later is not None and len(claimed) == len(devices) and all(v <= 0 for v in avail.values()):
            for late in preempting_later():
                if late.request_id not in scanned and not any(v in live for v in late.victims):
                    requeued.append(late.request_id)
            break
        scanned.add(w.request_id)
        if w.preempting_device is not None:
            dev = by_index[w.preempting_device]
            need = need_on(w, dev)
            if avail[dev.index] >= need:
                grants.append((w.request_id, dev.index))
                avail[dev.index] -= need
                continue
            if any(v in live for v in w.victims):
                avail[dev.index] -= min(avail[dev.index], need)
                waiting.append(w.request_id)
                continue
            requeued.append(w.request_id)

        cands = candidate_devices(w, devices)
        if not cands:
            waiting.append(w.request_id)
            continue
        fits = [d for d in cands if avail[d.index] >= need_on(w, d)]
        if fits:
            dev = min(fits, key=lambda d: (avail[d.index] - need_on(w, d), d.index))
            grants.append((w.request_id, dev.index))
            avail[dev.index] -= need_on(w, dev)
            continue
        choice = choose_victims(w, [d for d in cands if d.index not in claimed], avail, leases, taken)
        if choice is not None:
            preemptions.append(choice)
            taken.update(choice.victims)
            dev = by_index[choice.device_index]
            avail[dev.index] -= min(avail[dev.index], need_on(w, dev))
            waiting.append(w.request_id)
            continue
        dev = max(cands, key=lambda d: (avail[d.index] - need_on(w, d), -d.index))
        avail[dev.index] -= min(avail[dev.index], need_on(w, dev))
        claimed.add(dev.index)
        waiting.append(w.request_id)

    return Plan(tuple(grants), tuple(preemptions), tuple(requeued), tuple(waiting))


def choose_victims(
    waiter: WaiterView,
    devices: list[DeviceView],
    avail: dict[int, int],
    leases: list[LeaseView],
    taken: set[str],
) -> Preemption | None:
    """The cheapest set of strictly-lower-priority leases whose eviction makes the waiter fit, or None.

    Cheapest: fewest victims, then the lowest top victim priority, then the fewest bytes evicted.
    """
    best: tuple[tuple[int, int, int, int], Preemption] | None = None
    for dev in devices:
        need = need_on(waiter, dev)
        eligible = [
            lease for lease in leases
            if lease.device_index == dev.index and lease.priority < waiter.priority and lease.lease_id not in taken
        ]
        if avail[dev.index] + sum(lease.memory_bytes for lease in eligible) < need:
            continue
        eligible.sort(key=lambda lease: (lease.priority, -lease.memory_bytes, lease.lease_id))
        chosen: list[LeaseView] = []
        got = avail[dev.index]
        for lease in eligible:
            if got >= need:
                break
            chosen.append(lease)
            got += lease.memory_bytes
        # Greedy by priority may overshoot: spare whoever is not needed, most important first.
        for lease in sorted(chosen, key=lambda lease: (-lease.priority, lease.memory_bytes)):
            if got - lease.memory_bytes >= need:
                chosen.remove(lease)
                got -= lease.memory_bytes
        if not chosen:
            continue
        key = (len(chosen), max(lease.priority for lease in chosen), sum(lease.memory_bytes for lease in chosen), dev.index)
        if best is None or key < best[0]:
            victims = tuple(lease.lease_id for lease in chosen)
            best = (key, Preemption(waiter.request_id, dev.index, victims))
    return None if best is None else best[1]
