"""One JSON object per measured figure, appended as soon as it is measured, with the host it ran on."""
from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path


class Recorder:
    def __init__(self, bench: str, out: Path | None, family: str, command: str, host: str):
        self.bench, self.out, self.family, self.command, self.host = bench, out, family, command, host
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def __call__(self, mode: str, metric: str, value: float, unit: str, **extra) -> None:
        row = {"bench": self.bench, "model": self.family, "mode": mode, "metric": metric,
               "value": round(value, 4) if isinstance(value, float) else value, "unit": unit, "host": self.host,
               "command": self.command, "date": self.date, **extra}
        print(json.dumps(row), flush=True)
        if self.out:
            with self.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


def host_description() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = "no GPU"
    import torch

    return f"{gpu}; torch {torch.__version__}"


