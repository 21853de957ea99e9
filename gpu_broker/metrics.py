"""The broker's Prometheus figures: devices, leases and bytes by device and holder, the queue, transitions.

Updated on the event loop after each change of the books (never read from the scrape thread), so a scrape
sees the state after the last completed operation.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge

DEVICE_BYTES = Gauge("diffusion_broker_device_bytes", "Memory of each device the broker lends", ["device"])
LEASED_BYTES = Gauge("diffusion_broker_leased_bytes", "Bytes leased, by device and holder", ["device", "holder"])
LEASES = Gauge("diffusion_broker_leases", "Leases held, by device and holder", ["device", "holder"])
QUEUE = Gauge("diffusion_broker_queue_depth", "Acquire requests waiting")
YIELDING = Gauge("diffusion_broker_yielding_leases",
                 "Batch leases asked to yield compute to a busy interactive lease, by device", ["device"])
TRANSITIONS = Counter("diffusion_broker_transitions_total",
                      "Lease transitions by kind (granted, preempt_requested, over_lease, ...)", ["kind"])


def devices(infos) -> None:
    for d in infos:
        DEVICE_BYTES.labels(str(d.index)).set(d.total_bytes)


def books(leases, queue_depth: int) -> None:
    """Sets the lease gauges from the live leases (LeaseRecord-like: device_index, holder, memory_bytes)."""
    bytes_by, count_by, yielding = {}, {}, {}
    for lease in leases:
        device = str(lease.device_index)
        yielding[device] = yielding.get(device, 0) + (1 if getattr(lease, "yielding_to", "") else 0)
        key = (str(lease.device_index), lease.holder.client_id)
        bytes_by[key] = bytes_by.get(key, 0) + lease.memory_bytes
        count_by[key] = count_by.get(key, 0) + 1
    LEASED_BYTES.clear()
    LEASES.clear()
    for key, value in bytes_by.items():
        LEASED_BYTES.labels(*key).set(value)
        LEASES.labels(*key).set(count_by[key])
    YIELDING.clear()
    for device, n in yielding.items():
        YIELDING.labels(device).set(n)
    QUEUE.set(queue_depth)


def transition(kind: str) -> None:
    TRANSITIONS.labels(kind).inc()
