"""Services started by fork from one warm interpreter (service_kit.service_zygote) instead of a fresh one each.

`enable()` starts the warm interpreter; from then on `service_process.start_service` asks it first, and starts a
fresh interpreter only where it cannot serve (it says why: `ServiceProcess.how`). A forked service is handed back
as a `ForkedProcess`, which has the part of `subprocess.Popen` our callers use (pid, stdout, stderr, poll, wait,
send_signal, terminate, kill, returncode). Each start then costs a fork instead of seconds of imports: the tests
use it, which start well over a hundred services.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

READY_TIMEOUT_S = 300.0
ANSWER_TIMEOUT_S = 30.0


class ForkedProcess:
    """A service the warm interpreter forked: not our child, so its exit status arrives as a message."""

    def __init__(self, pid: int, args: list[str], stdout, stderr):
        self.pid, self.args, self.stdout, self.stderr = pid, args, stdout, stderr
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmStarts:
    def __init__(self, env: dict[str, str], cwd: str):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._zygote = subprocess.Popen([sys.executable, "-m", "service_kit.service_zygote", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                        env=env)
        theirs.close()
        # What its imports printed (a fresh service would print it in its own log): kept for why it failed.
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=lambda: self.stderr_tail.extend(self._zygote.stderr), daemon=True).start()
        self._sock = ours
        self._ready = threading.Event()
        self.unusable = ""
        self._answers: queue.Queue[dict] = queue.Queue()
        self._children: dict[int, ForkedProcess] = {}
        self._early_ends: dict[int, int] = {}
        self._request_lock = threading.Lock()  # one request at a time: answers come back in order
        self._children_lock = threading.Lock()
        threading.Thread(target=self._read, name="warm-starts", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                tail = " | ".join(line.strip() for line in list(self.stderr_tail)[-3:])
                self.unusable = self.unusable or f"the warm interpreter exited: {tail or 'no output'}"
                self._ready.set()
                self._answers.put({"cold": self.unusable})
                return
            message = json.loads(data)
            if "ready" in message or "unusable" in message:
                self.unusable = message.get("unusable", "")
                self._ready.set()
            elif "exited" in message:
                with self._children_lock:
                    child = self._children.pop(message["exited"], None)
                    if child is None:
                        self._early_ends[message["exited"]] = message["code"]
                if child is not None:
                    child._exited(message["code"])
            else:
                self._answers.put(message)

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: str) -> ForkedProcess | str:
        """The forked service, or why it must start as a fresh interpreter."""
        if not self._ready.wait(READY_TIMEOUT_S):
            return "the warm interpreter did not get ready in time"
        if self.unusable:
            return self.unusable
        pipes = [os.pipe() for _ in range(2)]
        stdin = os.open(os.devnull, os.O_RDONLY)
        with self._request_lock:
            try:
                socket.send_fds(self._sock, [json.dumps({"module": module, "argv": list(args), "env": env,
                                                         "cwd": cwd}).encode()],
                                [stdin, pipes[0][1], pipes[1][1]])
                answer = self._answers.get(timeout=ANSWER_TIMEOUT_S)
            except (OSError, queue.Empty) as e:
                answer = {"cold": f"the warm interpreter did not answer ({type(e).__name__})"}
            finally:
                for fd in (stdin, pipes[0][1], pipes[1][1]):
                    os.close(fd)
            if "started" not in answer:
                for read_end, _ in pipes:
                    os.close(read_end)
                return answer.get("cold", "the warm interpreter refused")
            pid = answer["started"]
            child = ForkedProcess(pid, [sys.executable, "-m", module, *args],
                                  os.fdopen(pipes[0][0], "r"), os.fdopen(pipes[1][0], "r"))
            with self._children_lock:
                if pid in self._early_ends:
                    child._exited(self._early_ends.pop(pid))
                else:
                    self._children[pid] = child
        return child

    def close(self) -> None:
        """Ends the warm interpreter and any service it forked that is still running."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # a close alone would not wake the reader, nor tell the zygote
        except OSError:
            pass
        self._sock.close()
        try:
            self._zygote.wait(30)
        except subprocess.TimeoutExpired:
            self._zygote.kill()
            self._zygote.wait()


_warm: WarmStarts | None = None


def enable(env: dict[str, str], cwd: str) -> WarmStarts:
    """Starts the warm interpreter (its imports run in the background) for the services this process starts."""
    global _warm
    if _warm is None:
        _warm = WarmStarts(env, cwd)
    return _warm


def current() -> WarmStarts | None:
    return _warm


def disable() -> None:
    global _warm
    if _warm is not None:
        _warm.close()
        _warm = None
