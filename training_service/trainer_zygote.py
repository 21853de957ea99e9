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

import os
import sys
import traceback
from pathlib import Path

from service_kit import fork_server

WARM_IMPORTS = ("transformers",)
# Where no GPU is visible (see fork_server.PIPELINES for why only there); a GPU host's trainers import these.
NO_GPU_IMPORTS = ("peft", "training_service.lora_recipe")


def _run_trainer(sock, request: dict, fds: list[int]) -> None:
    """In the forked child: become the job's trainer. Never returns."""
    code = 1
    try:
        fork_server.take_stdio(sock, fds)
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


def main(service_pid: int, sock) -> None:
    """In the process forked from the service: wait for the first job's call, warm up, then serve. When the
    service closes its end, wait for the trainers it already stopped, then go."""
    from training_service.trainer_child import die_with_the_service

    die_with_the_service(service_pid)
    first = sock.recv(65536)
    if not first:  # the service ended without a job
        return
    unusable = fork_server.warm_imports(WARM_IMPORTS, NO_GPU_IMPORTS)
    if unusable:
        fork_server.send(sock, {"unusable": unusable})
        return
    fork_server.send(sock, {"ready": True})
    fork_server.serve(sock, _run_trainer, lambda request, pid: {"started": request["job_dir"], "pid": pid})
