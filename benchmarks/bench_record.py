"""One JSON object per measured figure, appended as soon as it is measured, with the host and the code it ran on."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path


class Recorder:
    def __init__(self, bench: str, out: Path | None, family: str, command: str, host: str):
        self.bench, self.out, self.family, self.host = bench, out, family, host
        self.command = portable_command(command, out)
        self.code = code_version()
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def __call__(self, mode: str, metric: str, value: float, unit: str, **extra) -> None:
        self.write({"bench": self.bench, "model": self.family, "mode": mode, "metric": metric,
                    "value": round(value, 4) if isinstance(value, float) else value, "unit": unit, **self.stamp(),
                    **extra})

    def stamp(self) -> dict:
        """What every row says of where it was measured: the host, the command, the code and the date."""
        return {"host": self.host, "command": self.command, "code": self.code, "date": self.date}

    def write(self, row: dict) -> None:
        """Prints a row and appends it to the output file: for a bench whose rows are not per model and mode."""
        print(json.dumps(row), flush=True)
        if self.out:
            with self.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


def portable_command(command: str, out: Path | None) -> str:
    """The command as someone reruns it: an output file given by an absolute path by its name alone (a device's
    output folder does not exist anywhere else); a relative one, within the checkout, as given."""
    if out is None or not out.is_absolute():
        return command
    return " ".join(out.name if word == str(out) else word for word in command.split(" "))


def code_version(root: Path | None = None) -> str:
    """The commit the figures were measured at, "+changes" when the work tree differs from it (tracked files
    only); "unknown" outside a git checkout. A figure without its code cannot be compared. BENCH_CODE, where set,
    names it instead: a copy of a work tree whose git folder is not the one it was copied from (a device machine's
    copy can carry an older HEAD) is told the commit by the command that runs it."""
    if os.environ.get("BENCH_CODE"):
        return os.environ["BENCH_CODE"]
    where = root or Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "")


def host_description() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = "no GPU"
    import torch

    return f"{gpu}; torch {torch.__version__}"


