"""Which compiled functions dynamo stopped compiling in this process, and at which of its limits.

Past its recompile limit (`recompile_limit` graphs of one code object, `accumulated_recompile_limit` over all)
dynamo runs a function's calls that no graph covers uncompiled from then on. Unless the compile is fullgraph (which
raises instead), the only sign is one warning on dynamo's own logger, so a job would train slower with nothing in
its record. A process that compiles without fullgraph installs the watch once; `hits()` lists what dynamo gave up
on since, for the caller's record. The watch reads that warning's arguments (the limit's name, its value, the
function), so a process whose torch logging drops dynamo's warnings sees none.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

DYNAMO_LOGGER = "torch._dynamo.convert_frame"
_PREFIX = "torch._dynamo hit config."


@dataclass(frozen=True)
class LimitHit:
    limit: str  # the config's name: recompile_limit or accumulated_recompile_limit
    value: str  # its value when hit
    function: str  # as dynamo names it: 'forward' (file:line)

    def describe(self) -> str:
        return f"{self.function} reached dynamo's {self.limit} ({self.value})"


class _Watch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[LimitHit] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if isinstance(record.msg, str) and record.msg.startswith(_PREFIX) and len(args) >= 3:
            self.seen.append(LimitHit(str(args[0]), str(args[1]), str(args[2])))


_watch: _Watch | None = None
_lock = threading.Lock()


def install() -> None:
    """Starts watching dynamo's logger in this process (once; later calls do nothing)."""
    global _watch
    with _lock:
        if _watch is None:
            _watch = _Watch()
            logging.getLogger(DYNAMO_LOGGER).addHandler(_watch)


def hits() -> list[LimitHit]:
    """Every limit dynamo met since install(), oldest first (empty before it)."""
    with _lock:
        return list(_watch.seen) if _watch is not None else []
