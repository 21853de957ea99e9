"""Which inference worker gets a call: a pure policy over what the router knows of each worker.

A worker holds at most one model (the inference service never keeps two pipelines resident), so:
- a Generate goes to a reachable worker that has the model, the one with the fewest calls in flight first,
  ties to the one that was picked least recently (so equal workers take turns);
- a Load of a model some worker already has goes there (it replaces or reloads it, as a single service would);
  otherwise to a reachable worker with no model and no load under way; a router never evicts one caller's
  model to make room for another's, so with every worker taken the Load is refused, naming what they hold.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerView:
    """What the router knows of one worker when it chooses. An unreachable worker keeps the models it had when
    last seen, so a call for them is told to retry (the worker may come back) rather than to load."""

    address: str
    models: frozenset[str] = frozenset()
    in_flight: int = 0  # calls the router is forwarding to it now
    loading: str = ""  # the model a Load forwarded by the router is putting there, or ""
    reachable: bool = True
    last_picked: int = 0  # a counter value: larger is more recent


@dataclass(frozen=True)
class Refusal:
    """No worker can take the call: why, as an ErrorInfo reason and the text a caller reads."""

    reason: str
    message: str


def _least_busy(candidates: list[WorkerView]) -> WorkerView:
    return min(candidates, key=lambda w: (w.in_flight, w.last_picked))


def loaded_models(workers: list[WorkerView]) -> list[str]:
    """Every model some reachable worker has, sorted, each once."""
    return sorted({m for w in workers if w.reachable for m in w.models})


def for_generate(workers: list[WorkerView], model_id: str,
                 exclude: frozenset[str] = frozenset()) -> WorkerView | Refusal:
    """`exclude`: workers this call already tried and found gone."""
    with_model = [w for w in workers if w.reachable and model_id in w.models and w.address not in exclude]
    if with_model:
        return _least_busy(with_model)
    if any(model_id in w.models for w in workers):  # last known to have it, but gone or already tried
        return Refusal("WORKER_UNAVAILABLE", f"every worker that has model {model_id!r} stopped answering; retry")
    loaded = ", ".join(loaded_models(workers)) or "none"
    return Refusal("MODEL_NOT_LOADED", f"model {model_id!r} is not loaded on any worker (loaded: {loaded}); "
                                       "call Load first")


def for_load(workers: list[WorkerView], model_id: str) -> WorkerView | Refusal:
    reachable = [w for w in workers if w.reachable]
    if not reachable:
        return Refusal("WORKER_UNAVAILABLE", "no inference worker is answering; retry")
    holding = [w for w in reachable if model_id in w.models or w.loading == model_id]
    if holding:
        return _least_busy(holding)
    free = [w for w in reachable if not w.models and not w.loading]
    if free:
        return _least_busy(free)
    taken = "; ".join(f"{w.address}: {', '.join(sorted(w.models)) or 'loading ' + w.loading}" for w in reachable)
    return Refusal("NO_FREE_WORKER", f"every worker holds a model ({taken}); unload one first, or add a worker")
