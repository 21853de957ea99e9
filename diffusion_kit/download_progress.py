"""Byte progress of a hub download, measured as the growth of the repo's cache folder.

huggingface_hub writes each file as `blobs/<hash>.incomplete` and renames it when done, with or
without hf_xet, so the bytes under the repo folder, less what was there before, are the bytes
fetched so far. Measuring the disk instead of hooking a progress bar works for every transfer
backend and counts files fetched in parallel.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:  # renamed or removed while we looked
            continue
    return total


class GrowthWatcher:
    """Calls on_progress(bytes_done, bytes_total) every `interval` seconds until stopped, then once more.

    `needed` is the size of the scoped file list; what the repo folder already holds is not fetched
    again, so the total reported is needed less that (an estimate when other revisions are cached)."""

    def __init__(self, folder: Path, needed: int, on_progress: Callable[[int, int], None], interval: float = 0.5):
        self.folder, self.on_progress, self.interval = Path(folder), on_progress, interval
        self._start = folder_bytes(self.folder) if self.folder.exists() else 0
        self.total = max(0, needed - self._start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)
        self._last = -1

    def done(self) -> int:
        grown = (folder_bytes(self.folder) if self.folder.exists() else 0) - self._start
        return max(0, min(grown, self.total)) if self.total else max(0, grown)

    def _report(self) -> None:
        """Reports the bytes done when they passed the last report: a progress figure never goes back, though the
        folder can shrink for a moment (a partial file truncated and written again, as a restarted fetch does)."""
        value = self.done()
        if value > self._last:
            self._last = value
            self.on_progress(value, self.total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._report()

    def __enter__(self) -> "GrowthWatcher":
        self.on_progress(0, self.total)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._report()
