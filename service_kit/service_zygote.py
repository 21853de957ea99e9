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
import os
import runpy
import signal
import socket
import sys
import traceback

from service_kit import fork_server

WARM_IMPORTS = ("grpc", "transformers", "huggingface_hub", "diffusion_client", "gpu_broker.server",
                "inference_service.server", "inference_router.server", "training_service.server",
                "training_service.jobs")
# Where no GPU is visible (see fork_server.PIPELINES for why only there).
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


def _become(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m MODULE ARGV`. Never returns."""
    code: int | str | None = 1
    try:
        fork_server.take_stdio(sock, fds)
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


def main(sock_fd: int) -> None:
    ours = dict(os.environ)  # what the children are compared with, before this process sets anything
    sock = socket.socket(fileno=sock_fd)
    unusable = fork_server.warm_imports(WARM_IMPORTS, NO_GPU_IMPORTS)
    if unusable:
        fork_server.send(sock, {"unusable": unusable})
        return
    fork_server.send(sock, {"ready": True})
    fork_server.serve(sock, _become, lambda request, pid: {"started": pid}, kill_on_close=True,
                      refuse=lambda request: _cold_because(request["env"], ours))


def _cold_because(env: dict[str, str], ours: dict[str, str]) -> str:
    differ = import_time_differences(env, ours)
    return f"set differently from the warm interpreter, read at import: {', '.join(differ)}" if differ else ""


if __name__ == "__main__":
    main(int(sys.argv[1]))
