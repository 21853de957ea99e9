"""Services a test, the demo or a benchmark starts do not outlive it: killed mid-run (a device command's time
limit, a CI timeout), it would otherwise leave them serving, holding ports, leases and GPU memory."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from service_kit.service_process import ROOT, service_env

STARTER = """
import sys, time
from service_kit.service_process import start_service
service = start_service("gpu_broker", "--fake-devices", "1x24GiB", timeout=60)
print(service.proc.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (a reparented process may wait for one a long time)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_service_stops_when_the_process_that_started_it_is_killed():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env=service_env())
    try:
        service_pid = int(starter.stdout.readline())
        time.sleep(0.5)
        assert alive(service_pid)  # serving while its starter lives
        starter.send_signal(signal.SIGKILL)  # no finally block, no handler: only the kernel can tell the service
        starter.wait()
        deadline = time.monotonic() + 20
        while alive(service_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(service_pid), "the service outlived the process that started it"
    finally:
        starter.kill()
        if "service_pid" in locals() and alive(service_pid):
            os.kill(service_pid, signal.SIGKILL)
