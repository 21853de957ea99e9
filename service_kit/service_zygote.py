"""The warm start of our services: `python -m service_kit.service_zygote SOCKET_FD`.

Imports what the services import (grpc, torch, transformers, torchao, diffusers and its pipelines, peft and our
own packages) once, then forks one child per request that becomes `python -m MODULE ARGS`: it takes the
request's stdio, environment and working directory and runs the module's `__main__` through runpy, as the
interpreter's `-m` does. A child is a real process with its own pid and signals; only the interpreter start and
the imports are shared. `service_process.start_service` uses it where a caller asked for warm starts (the
tests, which start well over a hundred services).

A library reads some variables once, at import (huggingface_hub its cache and endpoint, torch its threads):
a request whose environment differs from this process's in one of those (IMPORT_TIME_ENV) is answered `cold`,
and the caller starts that service as a fresh interpreter.

Protocol, over the SOCK_SEQPACKET Unix socket passed as SOCKET_FD, one JSON object per message:
- caller -> here: {"module", "argv", "env", "cwd"} with three descriptors attached (stdin, stdout, stderr);
- here -> caller: {"ready": true} or {"unusable": why} once; per request {"started": PID} or {"cold": why};
  {"exited": PID, "code": C} when a child ends (C negative: killed by signal -C).
The caller closing the socket ends this process, and with it any child still running (SIGKILL).
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

WARM_IMPORTS = ("grpc", "torch", "transformers", "diffusers", "huggingface_hub", "diffusion_client",
                "gpu_broker.server", "inference_service.server", "inference_router.server", "training_service.server",
                "training_service.jobs")
# The pipelines import peft, and peft imports bitsandbytes, which creates a CUDA context where a GPU is visible
# (and a fork of a process holding one cannot use CUDA): these are warmed only on a host without a GPU.
WARM_PIPELINES = ("ZImagePipeline", "FluxPipeline", "QwenImagePipeline", "StableDiffusionXLPipeline")
NO_GPU_IMPORTS = ("torchao", "peft", "inference_service.engine", "training_service.lora_recipe",
                  "training_service.trainer_child")
# Variables a warm library may have read already (by prefix): a child cannot change them...
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DIFFUSERS_", "TORCH", "PYTORCH", "CUDA_", "NVIDIA_",
                   "OMP_", "MKL_", "KMP_", "XDG_", "HOME", "PYTHON", "LD_", "GRPC_", "BNB_", "TOKENIZERS_")
# ...except these, which torch reads when a compile runs (torch._inductor.runtime.cache_dir_utils; torch itself
# sets the first one in a process that compiled)...
READ_WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# ...and these, read at import, where the value the services set (diffusion_kit.compile_cache) is torch's default.
SAME_AS_UNSET = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


def import_time_differences(env: dict[str, str], ours: dict[str, str]) -> list[str]:
    """The variables read at import that `env` sets differently from `ours` (set, changed or unset)."""
    def value(source: dict[str, str], name: str) -> str | None:
        found = source.get(name)
        return None if found == SAME_AS_UNSET.get(name) else found

    names = {k for k in (*env, *ours) if k.startswith(IMPORT_TIME_ENV) and k not in READ_WHEN_USED}
    return sorted(k for k in names if value(env, k) != value(ours, k))


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _become(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m MODULE ARGV`. Never returns."""
    code: int | str | None = 1
    try:
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code
    except BaseException:  # noqa: BLE001 - the child's stderr says what broke, as an interpreter's would
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at exit (span exporters flush here)
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


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
            pass


def serve(sock: socket.socket, ours: dict[str, str]) -> None:
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
        if not data:  # the caller is gone: so are its services
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap(sock, children, block=True)
            return
        request = json.loads(data)
        differ = import_time_differences(request["env"], ours)
        if differ:
            for fd in fds:
                os.close(fd)
            _send(sock, {"cold": f"set differently from the warm interpreter, read at import: {', '.join(differ)}"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(sock, request, fds)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        _send(sock, {"started": pid})


def main(sock_fd: int) -> None:
    ours = dict(os.environ)  # what the children are compared with, before this process sets anything
    sock = socket.socket(fileno=sock_fd)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # torch asks NVML, so nothing here creates a CUDA context
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
        _send(sock, {"unusable": "importing the services' libraries created a CUDA context, which a forked "
                                 "service cannot use"})
        return
    gc.collect()
    gc.freeze()  # children do not copy the pages of what was imported when their collector runs
    _send(sock, {"ready": True})
    serve(sock, ours)


if __name__ == "__main__":
    main(int(sys.argv[1]))
