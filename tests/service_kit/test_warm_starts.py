"""Services forked from the warm interpreter: which environments must start fresh, and a forked service's
process surface (pid, signals, exit status) against a real one."""
import os
import signal

import pytest

from service_kit.service_process import start_service
from service_kit.service_zygote import import_time_differences

OURS = {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/a"}


@pytest.mark.parametrize("changes, differ", [
    ({}, []),
    ({"DIFFUSION_TOKEN": "x", "OTEL_TRACES_EXPORTER": "otlp", "PATH": "/bin"}, []),  # read when used
    ({"HF_HOME": "/tmp/hf"}, ["HF_HOME"]),  # huggingface_hub's cache paths are fixed at import
    ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:1"}, ["HF_ENDPOINT", "HF_HUB_OFFLINE"]),
    ({"OMP_NUM_THREADS": None}, ["OMP_NUM_THREADS"]),  # unset counts as a difference
    ({"TORCHINDUCTOR_CACHE_DIR": "/tmp/b", "TRITON_CACHE_DIR": "/tmp/c"}, []),  # read when a compile runs
    ({"TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}, []),  # torch's default, as the services set it
    ({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, ["TORCHINDUCTOR_FX_GRAPH_CACHE"]),
    ({"PYTHONHASHSEED": "0"}, ["PYTHONHASHSEED"]),
])
def test_which_variables_need_a_fresh_interpreter(changes, differ):
    env = {k: v for k, v in {**OURS, **changes}.items() if v is not None}
    assert import_time_differences(env, OURS) == differ


def test_a_forked_service_is_a_process_of_its_own():
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB")
    assert broker.how == "forked from the warm interpreter"
    assert broker.proc.pid != os.getpid() and broker.proc.poll() is None
    with open(f"/proc/{broker.proc.pid}/environ", "rb") as f:
        assert b"HF_HUB_OFFLINE=1" in f.read().split(b"\0")
    broker.proc.send_signal(signal.SIGKILL)
    assert broker.proc.wait(10) == -signal.SIGKILL
    assert broker.stop() == -signal.SIGKILL  # already gone: stop reports how it ended


def test_an_import_time_variable_starts_fresh_and_says_why(tmp_path):
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB", env={"HF_HOME": str(tmp_path)})
    try:
        assert broker.how.startswith("a fresh interpreter") and "HF_HOME" in broker.how
    finally:
        broker.stop()
