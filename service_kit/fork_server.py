"""What both warm interpreters share (service_kit.service_zygote for the services the tests start,
training_service.trainer_zygote for a service's job trainers): the imports that must not create a CUDA context,
and the loop that forks one child per request.

Requests arrive over a SOCK_SEQPACKET Unix socket, one JSON object each with the child's stdio descriptors
attached; the answer is {"started": ...} (or why not), and {"exited": PID, "code": C} follows when a child
ends (C negative: killed by signal -C).
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from typing import Callable

from service_kit.heap_freeze import freeze_imported

# The pipelines import peft, and peft imports bitsandbytes, which creates a CUDA context where a GPU is visible
# (seen on an H200), and a fork of a process holding one cannot use CUDA: these are warmed only without a GPU.
PIPELINES = ("ZImagePipeline", "FluxPipeline", "QwenImagePipeline", "StableDiffusionXLPipeline")


def pipelines_to_warm() -> tuple[str, ...]:
    """The pipelines a process may import ahead of use: all of them where no GPU is visible, none where one is."""
    import torch

    return () if torch.cuda.is_available() else PIPELINES


def warm_imports(modules: tuple[str, ...], no_gpu_modules: tuple[str, ...]) -> str:
    """Imports `modules`, and where no GPU is visible also the pipelines and `no_gpu_modules`. Returns why the
    result cannot serve forks ("" when it can)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch asks NVML: its checks create no context
    for name in ("torch", "diffusers", *modules):
        __import__(name)
    import torch

    for name in () if torch.cuda.is_available() else no_gpu_modules:
        __import__(name)
    # Frozen, the imports are not walked by a child's collector either, so the child does not copy their pages.
    freeze_imported(pipelines_to_warm())
    if torch.cuda.is_initialized():
        return "importing its libraries created a CUDA context, which a forked child cannot use"
    return ""


def send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _reap(sock: socket.socket, children: set[int], block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        try:
            send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass  # the caller is gone


def serve(sock: socket.socket, become: Callable[[socket.socket, dict, list[int]], None],
          started: Callable[[dict, int], dict], refuse: Callable[[dict], str] = lambda request: "",
          kill_on_close: bool = False) -> None:
    """Forks a child per request that runs `become(sock, request, fds)` (which never returns) and answers
    `started(request, pid)`, or {"cold": why} where `refuse` says why not. When the caller closes the socket:
    kills the children still running if `kill_on_close`, waits for them, and returns."""
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.1)
        _reap(sock, children)
        if not ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            if kill_on_close:
                for pid in children:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            _reap(sock, children, block=True)
            return
        request = json.loads(data)
        why = refuse(request)
        if why:
            for fd in fds:
                os.close(fd)
            send(sock, {"cold": why})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            become(sock, request, fds)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        send(sock, started(request, pid))


def take_stdio(sock: socket.socket, fds: list[int]) -> None:
    """In a forked child: the request's descriptors become its stdin, stdout and stderr; the socket is closed."""
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
