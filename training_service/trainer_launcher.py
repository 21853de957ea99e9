"""How a job's trainer process starts: forked from the warm trainer (training_service.trainer_zygote), which
has the trainer's libraries imported already, or as a fresh interpreter when the warm one cannot serve.

Either way the service gets an object with the asyncio subprocess surface it uses (pid, returncode, stdin,
stdout, stderr, wait, kill), and the job's stream says which start it was and, for a fresh one, why.
The warm trainer is forked when the service starts (a fork copies only the calling thread, so it must come
before the service starts any) and imports its libraries when the first job asks for it, so a service that
never trains never pays for them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("training_service.trainer_launcher")

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # where `-m training_service...` runs
WARM_START_TIMEOUT_S = 300.0


def fork_warm_trainer() -> tuple[int, socket.socket] | str:
    """Forks the warm trainer (training_service.trainer_zygote) now: its pid and our end of its socket, or why
    it could not be forked. Call it while this process runs one thread only."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "this platform cannot tell whether the service is single-threaded (no /proc)"
    if threads != 1:
        return f"the service already ran {threads} threads when it could fork it"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    service_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ours.close()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            from training_service import trainer_zygote

            trainer_zygote.main(service_pid, theirs)
        except BaseException:  # noqa: BLE001 - its stderr is the service's
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    theirs.close()
    return pid, ours


class ForkedTrainer:
    """A trainer the warm trainer forked: not this process's child, so its end comes as a message."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, ended: asyncio.Future):
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self._ended = ended
        self.returncode: int | None = None
        ended.add_done_callback(lambda f: setattr(self, "returncode", f.result()))

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class Started:
    process: object  # asyncio.subprocess.Process or ForkedTrainer
    how: str  # which start, and for a fresh one why
    fell_back: bool = False  # a fresh start although the warm trainer was wanted


class TrainerLauncher:
    def __init__(self, warm: tuple[int, socket.socket] | str | None = None):
        """`warm`: what fork_warm_trainer returned; None: the warm trainer is off."""
        self._want_warm = warm is not None
        self._sock: socket.socket | None = None
        self._zygote: int | None = None  # the warm trainer's pid, until it is reaped
        self._starting: asyncio.Task | None = None
        if warm is None:
            self._unusable = "the warm trainer is off (--no-warm-trainer)"
        elif isinstance(warm, str):
            self._unusable = f"the warm trainer could not be forked: {warm}"
        else:
            self._unusable = ""
            self._zygote, self._sock = warm
            self._sock.setblocking(False)
        self._pending: asyncio.Queue[dict] = asyncio.Queue()  # "started" answers, in request order
        self._ended: dict[int, asyncio.Future] = {}
        self._early_ends: dict[int, int] = {}  # exits that arrived before their "started" was taken
        self._lock = asyncio.Lock()  # one request on the socket at a time: answers come back in order
        self._reader: asyncio.Task | None = None

    async def start(self, job_dir: Path, service_pid: int, env: dict[str, str] | None) -> Started:
        if await self._warm_ready():
            try:
                return Started(await self._fork(job_dir, env), "forked from the warm trainer (libraries imported "
                                                                 "once per service)")
            except (OSError, ConnectionError, asyncio.TimeoutError) as e:
                self._give_up(f"the warm trainer stopped answering ({type(e).__name__}: {e})")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "training_service.trainer_child", str(job_dir), str(service_pid), cwd=PACKAGE_ROOT,
            env={**os.environ, **env} if env else None,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return Started(process, f"the trainer started as a fresh process: {self._unusable}",
                       fell_back=self._want_warm)

    async def _warm_ready(self) -> bool:
        if self._unusable:
            return False
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start_zygote())
        await asyncio.shield(self._starting)
        return not self._unusable

    async def _start_zygote(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(self._sock, json.dumps({"warm_up": True}).encode())
            first = json.loads(await asyncio.wait_for(loop.sock_recv(self._sock, 65536), WARM_START_TIMEOUT_S)
                               or b"{}")
        except (OSError, ValueError, asyncio.TimeoutError) as e:
            first = {"unusable": f"it did not start ({type(e).__name__})"}
        if not first.get("ready"):
            self._give_up(first.get("unusable") or "it exited while starting")
            return
        log.info("warm trainer ready", extra={"fields": {"event": "training.warm_trainer", "pid": self._zygote}})
        self._reader = loop.create_task(self._read_answers())

    async def _read_answers(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.sock_recv(self._sock, 65536)
            except OSError:
                data = b""
            if not data:
                self._give_up("the warm trainer exited")
                return
            message = json.loads(data)
            if "started" in message:
                await self._pending.put(message)
            elif "exited" in message:
                future = self._ended.pop(message["exited"], None)
                if future is None:
                    self._early_ends[message["exited"]] = message["code"]
                elif not future.done():
                    future.set_result(message["code"])

    async def _fork(self, job_dir: Path, env: dict[str, str] | None) -> ForkedTrainer:
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            async with self._lock:
                socket.send_fds(self._sock, [json.dumps({"job_dir": str(job_dir), "env": env or {}}).encode()],
                                [stdin_r, stdout_w, stderr_w])
                answer = await asyncio.wait_for(self._pending.get(), 30)
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):  # the trainer has its own copies now
                os.close(fd)
        pid = answer["pid"]
        ended = loop.create_future()
        if pid in self._early_ends:
            ended.set_result(self._early_ends.pop(pid))
        else:
            self._ended[pid] = ended
        stdout, stderr = asyncio.StreamReader(limit=2**24), asyncio.StreamReader(limit=2**24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), os.fdopen(stdout_r, "rb", 0))
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(stderr_r, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(stdin_w, "wb", 0))
        stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        return ForkedTrainer(pid, stdin, stdout, stderr, ended)

    def _give_up(self, why: str) -> None:
        """From now on every trainer starts fresh; trainers already forked died with the warm one."""
        if not self._unusable:
            log.warning("warm trainer unusable; trainers start fresh", extra={"fields": {
                "event": "training.warm_trainer_unusable", "why": why}})
        self._unusable = self._unusable or f"the warm trainer is unusable: {why}"
        for future in self._ended.values():
            if not future.done():
                future.set_result(-signal.SIGKILL)
        self._ended.clear()

    async def close(self) -> None:
        """Lets the warm trainer go once its trainers have ended (they were told to stop already)."""
        if self._reader is not None:
            self._reader.cancel()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._zygote is not None:
            pid, self._zygote = self._zygote, None
            try:
                await asyncio.wait_for(asyncio.to_thread(os.waitpid, pid, 0), 30)
            except asyncio.TimeoutError:
                os.kill(pid, signal.SIGKILL)
                await asyncio.to_thread(os.waitpid, pid, 0)
            except ChildProcessError:
                pass
