"""How long an idle model stays loaded (Ollama's keep_alive): a request's value, or the service default.

Negative keeps the model until it is unloaded or replaced; 0 unloads it once a generation ends with
nothing else queued; a positive value unloads it after that many seconds with no generation. An
idle unload releases the broker lease. Pure: the engine runs the timer.
"""
from __future__ import annotations

from diffusion_kit.resolved import Resolved, Source

MAX_KEEP_ALIVE_S = 30 * 24 * 3600  # a month: beyond it, ask for forever (negative)


def describe(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    return "unload after each generation" if seconds == 0 else f"{seconds:g}s idle"


def resolve_keep_alive(requested_s: float | None, default_s: float) -> tuple[float | None, Resolved]:
    """(seconds, or None for forever; the record). `requested_s` None: the request left it unset."""
    source = Source.DEFAULT if requested_s is None else Source.EXPLICIT
    value = default_s if requested_s is None else requested_s
    seconds = None if value < 0 else float(value)
    asked = "unset" if requested_s is None else f"{requested_s:g}s"
    reason = "the service's --keep-alive" if requested_s is None else ""
    return seconds, Resolved("keep_alive", asked, describe(seconds), source, reason=reason)
