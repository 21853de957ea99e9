"""Who yields a device's compute to whom. Pure: the leases in, a map out.

A batch lease (training) pauses its compute while an interactive lease (inference) on the same device is
busy, unless the batch holder's priority is above the busy holder's: an operator who ranks a training job over
the inference service keeps it at full rate. Memory never moves here; only compute is shared. Priorities are the
holders' own, not the queue-aged ones preemption compares: aging is how a waiter reaches the front of the queue,
not a rank over work already running.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class ShareView:
    lease_id: str
    device_index: int
    priority: int
    batch: bool
    busy: bool


def yields(leases: Iterable[ShareView]) -> dict[str, str]:
    """Each batch lease that must yield -> the busy interactive lease it yields to: on its device, the busy one of
    highest priority (the first given, on a tie), so its holder hears whom it waits for."""
    leases = list(leases)
    busiest: dict[int, ShareView] = {}
    for lease in leases:
        if lease.busy and not lease.batch:
            top = busiest.get(lease.device_index)
            if top is None or lease.priority > top.priority:
                busiest[lease.device_index] = lease
    return {lease.lease_id: busiest[lease.device_index].lease_id for lease in leases
            if lease.batch and lease.device_index in busiest
            and lease.priority <= busiest[lease.device_index].priority}
