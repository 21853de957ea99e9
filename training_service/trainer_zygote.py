"""The warm trainer: forked from the training service at its start (trainer_launcher.fork_warm_trainer).

It waits until the first job asks for it, then imports what a trainer needs once (torch, transformers and
diffusers; where no GPU is visible, also the pipelines and peft, see NO_GPU_IMPORTS), then forks one trainer
per job, so a job starts without paying those imports again (seconds of CPU each); whatever the service had
imported before it forked comes free. It never touches a GPU itself: a fork of a process holding a CUDA context
cannot use CUDA, so it refuses to serve (says `unusable`) if its imports created one, and the service then
starts each trainer fresh.

Protocol, over a SOCK_SEQPACKET Unix socket pair, one JSON object per message:
- service -> here: {"warm_up": true} once, first; then per job {"job_dir": ..., "env": {...}} with three
  descriptors attached (the trainer's stdin, stdout and stderr); the trainer runs
  `trainer_child.run_guarded(job_dir)` with `env` added to its environment;
- here -> service: {"ready": true} or {"unusable": why} once; {"started": job_dir, "pid": N} per trainer;
  {"exited": N, "code": C} when trainer N ends (C negative: killed by signal -C).
The service closing the socket ends this process once its trainers have ended; the service dying kills it
(and so its trainers) at once.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path

WARM_IMPORTS = ("torch", "transformers", "diffusers")
# The pipelines import peft, peft imports bitsandbytes, and importing bitsandbytes creates a CUDA context where
# a GPU is visible (seen on an H200): so these are warmed only on a host without one; a GPU host's trainers
# import them themselves.
WARM_PIPELINES = ("ZImagePipeline", "FluxPipeline", "QwenImagePipeline", "StableDiffusionXLPipeline")
NO_GPU_IMPORTS = ("peft", "training_service.lora_recipe")


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _run_trainer(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the job's trainer. Never returns."""
    code = 1
    try:
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(request.get("env") or {})
        from training_service.trainer_child import die_with_the_service, run_guarded, write_pid

        die_with_the_service(os.getppid())  # this warm trainer, which itself dies with the service
        write_pid(Path(request["job_dir"]))
        code = run_guarded(Path(request["job_dir"]))
    except BaseException:  # noqa: BLE001 - the job's stderr tail says what broke
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


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
            _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass  # the service is gone; its trainers go with this process


def serve(sock: socket.socket) -> None:
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.2)
        _reap(sock, children)
        if not ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the service closed its end: wait for the trainers it already stopped, then go
            _reap(sock, children, block=True)
            return
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_trainer(sock, request, fds)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        _send(sock, {"started": request["job_dir"], "pid": pid})


def main(service_pid: int, sock: socket.socket) -> None:
    """In the process forked from the service: wait for the first job's call, warm up, then serve."""
    from training_service.trainer_child import die_with_the_service

    die_with_the_service(service_pid)
    first = sock.recv(65536)
    if not first:  # the service ended without a job
        return
    # torch's availability checks through NVML, so that nothing here creates a CUDA context.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for name in WARM_IMPORTS:
        __import__(name)
    import diffusers
    import torch

    if not torch.cuda.is_available():
        for name in WARM_PIPELINES:
            getattr(diffusers, name)  # diffusers imports a pipeline's modules when it is first named
        for name in NO_GPU_IMPORTS:
            __import__(name)
    if torch.cuda.is_initialized():
        _send(sock, {"unusable": "importing the trainer's libraries created a CUDA context, which a forked "
                                 "trainer cannot use"})
        return
    _send(sock, {"ready": True})
    serve(sock)
