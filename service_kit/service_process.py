"""Starts our servers as child processes (port 0 allowed) and reads back the bound port: for tests, demo, bench."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root


@dataclass
class ServiceProcess:
    proc: subprocess.Popen  # or service_kit.warm_starts.ForkedProcess, which has the same surface
    address: str
    stderr_lines: list[str] = field(default_factory=list)
    metrics_port: int | None = None  # --metrics-listen's bound port
    how: str = "a fresh interpreter"  # or forked from the warm one (service_kit.warm_starts)

    def log_events(self) -> list[dict]:
        """The structured log lines the service wrote so far."""
        out = []
        for line in list(self.stderr_lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a service starts with: ours, offline, unbuffered, this repository importable."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def use_warm_starts() -> None:
    """From now on services start by fork from one warm interpreter where it can serve them."""
    from service_kit import warm_starts

    warm_starts.enable(service_env(), str(ROOT))


def start_service(module: str, *args: str, listen: str = "127.0.0.1:0", timeout: float = 30.0,
                  env: dict[str, str] | None = None, fresh: bool = False) -> ServiceProcess:
    """`fresh`: a new interpreter even where warm starts are on (`use_warm_starts`). A service in a new interpreter
    started from the main thread stops (drains) when this process dies, however it dies (STOP_WITH_PARENT_ENV)."""
    from service_kit import warm_starts
    from service_kit.server_runtime import STOP_WITH_PARENT_ENV

    env = service_env(env)
    argv = ["--listen", listen, *args]
    warm, how = (None if fresh else warm_starts.current()), "a fresh interpreter"
    proc = warm.spawn(module, argv, env, str(ROOT)) if warm is not None else None
    if isinstance(proc, str):
        proc, how = None, f"a fresh interpreter: {proc}"
    elif proc is not None:
        how = "forked from the warm interpreter"
    if proc is None:
        if threading.current_thread() is threading.main_thread():  # the death signal follows the starting thread
            env[STOP_WITH_PARENT_ENV] = str(os.getpid())  # a test or bench killed mid-run leaves no service behind
        proc = subprocess.Popen([sys.executable, "-m", module, *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(l.rstrip("\n")) for l in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("event") == "listening":
            return ServiceProcess(proc, msg["address"], lines, msg.get("metrics_port"), how)
    proc.kill()
    raise RuntimeError(f"{module} did not start: {' '.join(lines[-20:])}")
