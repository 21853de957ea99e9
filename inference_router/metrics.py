"""The router's Prometheus figures: per worker, whether it answers, what it has and what it is forwarding."""
from __future__ import annotations

from prometheus_client import Counter, Gauge

from inference_router.worker_choice import WorkerView

WORKER_UP = Gauge("diffusion_router_worker_up", "1 while the worker answers the router's polls", ["worker"])
WORKER_IN_FLIGHT = Gauge("diffusion_router_worker_in_flight", "Calls the router is forwarding to the worker now",
                         ["worker"])
WORKER_MODELS = Gauge("diffusion_router_worker_models", "Models the worker has loaded, as last seen", ["worker"])
ROUTED = Counter("diffusion_router_routed_total", "Calls forwarded, by worker and method", ["worker", "method"])


def set_worker(address: str, view: WorkerView) -> None:
    WORKER_UP.labels(address).set(1 if view.reachable else 0)
    WORKER_IN_FLIGHT.labels(address).set(view.in_flight)
    WORKER_MODELS.labels(address).set(len(view.models))


def routed(address: str, method: str) -> None:
    ROUTED.labels(address, method).inc()
