"""One job's durable event log: appended and fsynced on disk, its recent events kept in memory.

Watchers read the recent events from memory; an older replay reads the file from a sparse index of
byte offsets, a bounded chunk at a time, so no watcher rereads the whole log per event and a job with
a long history costs each watcher one pass, not one pass per event.
"""
from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path

TAIL = 2048  # events kept in memory per job
INDEX_EVERY = 256  # one byte offset kept per this many events
REPLAY_CHUNK = 512  # the most events one read from disk returns


class EventLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # appends come from the event loop, replays from worker threads
        self._tail: deque[dict] = deque(maxlen=TAIL)
        self._offsets: list[int] = []  # byte offset of event 1, 1 + INDEX_EVERY, 1 + 2 * INDEX_EVERY, ...
        self._size = 0
        self.last_sequence = 0
        self.disk_reads = 0  # replays served from the file (a watcher of recent events causes none)
        if self.path.exists():
            self._scan()

    def _scan(self) -> None:
        """Builds the index and the tail from an existing file, in one pass."""
        offset = 0
        with open(self.path, "rb") as f:
            for line in f:
                if line.strip():
                    event = json.loads(line)
                    self._note(event, offset)
                offset += len(line)
        self._size = offset

    def _note(self, event: dict, offset: int) -> None:
        if (event["sequence"] - 1) % INDEX_EVERY == 0:
            self._offsets.append(offset)
        self._tail.append(event)
        self.last_sequence = event["sequence"]

    def append(self, event: dict) -> None:
        """Appends durably; on a write error (a full disk) the file is cut back to its last whole event and
        the error raised: the event is not in the log."""
        line = (json.dumps(event) + "\n").encode()
        with self._lock:
            try:
                with open(self.path, "ab") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                try:
                    os.truncate(self.path, self._size)
                except OSError:
                    pass  # a torn last line is skipped when the log is read
                raise
            self._note(event, self._size)
            self._size += len(line)

    def remember(self, event: dict) -> None:
        """Keeps an event that could not be written, in memory only, so live watchers still see it."""
        with self._lock:
            self._tail.append(event)
            self.last_sequence = event["sequence"]

    @staticmethod
    def last_sequence_on_disk(path: Path) -> int:
        """The sequence of a log file's last event, read from its end (0 for none)."""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 65536))
                lines = [line for line in f.read().splitlines() if line.strip()]
        except FileNotFoundError:
            return 0
        for line in reversed(lines):
            try:
                return int(json.loads(line)["sequence"])
            except (ValueError, KeyError, TypeError):
                continue  # a partial line at the window's start, or a torn last write
        return 0

    def in_memory(self, from_sequence: int) -> bool:
        """Whether a read from this sequence is served from memory (no disk, safe on the event loop)."""
        with self._lock:
            return not self._tail or max(1, from_sequence) >= self._tail[0]["sequence"]

    def read(self, from_sequence: int = 0, limit: int | None = None) -> list[dict]:
        """Events with sequence >= from_sequence, in order: from memory when recent, else a chunk from disk."""
        start = max(1, from_sequence)
        with self._lock:
            if self._tail and start >= self._tail[0]["sequence"]:
                skip = start - self._tail[0]["sequence"]
                out = [e for i, e in enumerate(self._tail) if i >= skip]
                return out if limit is None else out[:limit]
            if start > self.last_sequence:
                return []
            offset = self._offsets[(start - 1) // INDEX_EVERY] if self._offsets else 0
            self.disk_reads += 1
        limit = REPLAY_CHUNK if limit is None else min(limit, REPLAY_CHUNK)
        out = []
        with open(self.path, "rb") as f:
            f.seek(offset)
            for line in f:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["sequence"] >= start:
                    out.append(event)
                    if len(out) >= limit:
                        break
        return out
