"""The broker's lease journal: the live leases, on disk, so a restarted broker keeps their memory for them.

A broker that dies (or is stopped) does not take the holders with it: they keep computing in the
memory they were lent until they notice. Without a journal a restarted broker would see an empty
device and could grant that memory to a newcomer. With one, it reads the leases back and keeps each
for its holder during the re-claim window (lease_book.LeaseBook.restore).

The file is rewritten whole on every change of the lease set (write, fsync, rename, fsync the
folder), so a crash leaves either the old or the new version, never a torn one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

VERSION = 1


class JournalError(Exception):
    """The journal exists but cannot be read; the broker refuses to start rather than forget leases."""


class LeaseJournal:
    def __init__(self, path: Path):
        self.path = path
        self._written: str | None = None

    def load(self) -> list[dict]:
        """The leases written last; [] when there is no journal yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise JournalError(f"cannot read the lease journal {self.path}: {e}") from e
        try:
            data = json.loads(text)
            if data.get("version") != VERSION or not isinstance(data.get("leases"), list):
                raise ValueError(f"not a version-{VERSION} lease journal")
            leases = data["leases"]
        except (ValueError, AttributeError) as e:
            raise JournalError(f"the lease journal {self.path} is unreadable ({e}); the leases it held cannot be "
                               "kept for their holders. Move it aside once no holder uses the devices, then start "
                               "again") from e
        self._written = _encode(leases)
        return leases

    def save(self, leases: list[dict]) -> bool:
        """Writes the lease set if it changed since the last write; returns whether it wrote."""
        text = _encode(leases)
        if text == self._written:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self._written = text
        return True


def _encode(leases: list[dict]) -> str:
    return json.dumps({"version": VERSION, "leases": leases}, sort_keys=True)
