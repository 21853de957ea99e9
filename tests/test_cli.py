"""The `diffusion` command and the client library against live services on loopback (real processes)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import grpc
import pytest
from PIL import Image

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from diffusion_client import Broker, ClientError
from diffusion_client.options import Connection
from service_kit.service_process import free_port, start_service
from tests.datasets import write_cards
from tests.inference_service.harness import InferenceClient
from tests.service_flags import TRAINING_ROOTS
from tests.tcp_proxy import TcpProxy


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = write_cards(root / "data")
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB")
    inference = start_service("inference_service", "--broker", broker.address, *InferenceClient.TEST_FLAGS,
                              "--adapter-store", str(root / "adapters"), timeout=180)
    training = start_service("training_service", "--broker", broker.address, *TRAINING_ROOTS, "--output-dir",
                             str(root / "out"), "--adapter-store", str(root / "adapters"), "--compile-backend",
                             "aot_eager", timeout=180)
    yield {"broker": broker.address, "inference": inference.address, "training": training.address,
           "data": data, "root": root}
    for proc in (training, inference, broker):
        proc.stop()


def cli(services, *args, timeout=180):
    flags = [f"--{name}={services[name]}" for name in ("inference", "training", "broker")]
    return subprocess.run([sys.executable, "-m", "diffusion_client", *flags, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_load_generate_models_status_unload(services, tiny_models, tmp_path):
    loaded = cli(services, "load", "z", str(tiny_models["zimage"]))
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded z (zimage)" in loaded.stdout and "LOAD_PHASE" not in loaded.stderr and "ready" in loaded.stderr

    made = cli(services, "--json", "generate", "z", "a red cube", "--width", "64", "--height", "64", "--steps", "2",
               "--seed", "4", "--seed", "9", "-o", str(tmp_path))
    assert made.returncode == 0, made.stderr
    summary = json.loads(made.stdout)
    assert [i["seed"] for i in summary["images"]] == [4, 9] and summary["timings_s"]["total"] > 0
    for image in summary["images"]:
        assert Image.open(io.BytesIO(open(image["path"], "rb").read())).size == (64, 64)
    shown = cli(services, "generate", "z", "a red cube", "--width", "64", "--height", "64", "--steps", "3",
                "-o", str(tmp_path))
    assert shown.returncode == 0 and "denoising" in shown.stderr and "3/3" in shown.stderr  # the tqdm bar

    models = cli(services, "models")
    assert models.returncode == 0 and models.stdout.splitlines()[1].split()[:2] == ["z", "zimage"]
    status = cli(services, "status")
    assert status.returncode == 0 and "inference-0" in status.stdout, status.stdout
    assert "COMPUTE" in status.stdout and "interactive" in status.stdout  # the inference lease's class
    assert cli(services, "unload", "z").returncode == 0
    assert "z" not in cli(services, "--json", "models").stdout


@pytest.mark.parametrize("args, code, text", [
    (["generate", "nothing-loaded", "a cube"], 4, "FAILED_PRECONDITION"),
    (["load", "m", "/definitely/outside/the/roots"], 6, "PERMISSION_DENIED"),
    (["load", "m", "/tmp/x", "--precision", "fp7"], 2, "'fp7' is not one of"),
    (["watch", "job-that-does-not-exist"], 3, "NOT_FOUND"),
])
def test_refusals_map_to_exit_codes(services, args, code, text):
    done = cli(services, *args)
    assert done.returncode == code, (done.returncode, done.stderr)
    assert text in done.stderr


def test_an_unreachable_service_is_exit_7_after_retries():
    done = subprocess.run([sys.executable, "-m", "diffusion_client", f"--broker=127.0.0.1:{free_port()}", "status"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 7 and "UNAVAILABLE" in done.stderr, done.stderr


def test_train_follows_to_succeeded_and_reattaches_after_a_dropped_connection(services, tiny_models):
    proxy = TcpProxy(services["training"])
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "diffusion_client", f"--training={proxy.address}", "--json", "train",
             "--family", "zimage", "--base", str(tiny_models["zimage"]), "--data", str(services["data"]),
             "--prompt", "a square", "--steps", "40", "--rank", "4", "--resolution", "64", "--seed", "1",
             "--gradient-checkpointing", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        events, cut = [], False
        for line in proc.stdout:
            events.append(json.loads(line))
            if not cut and "step" in events[-1]:
                proxy.cut()  # the connection drops mid-job; the service and the job carry on
                cut = True
        assert proc.wait(timeout=180) == 0, proc.stderr.read()
        stderr = proc.stderr.read()
    finally:
        proxy.close()
    assert cut and "re-attaching from event" in stderr, stderr
    sequences = [int(e["sequence"]) for e in events]
    assert sequences == list(range(1, len(sequences) + 1))  # nothing lost, nothing twice
    assert events[-1]["finished"]["state"] == "TRAINING_JOB_STATE_SUCCEEDED"
    assert [e["step"]["step"] for e in events if "step" in e] == list(range(1, 41))
    applied = {r["control"]: r["applied"] for r in events[0]["resolved"]["resolved"]}
    assert applied["gradient_checkpointing"] == "true (1 block call in every 2)"
    jobs = cli(services, "jobs")
    assert "succeeded" in jobs.stdout and cli(services, "adapters").returncode == 0


def test_the_client_retries_unavailable_with_backoff(services):
    proxy = TcpProxy(services["broker"])
    try:
        proxy.refuse_next(2)  # the first two connections are dropped at once, as by a restarting service
        gpu = Broker(proxy.address)
        assert gpu.status().devices and proxy.accepted >= 3
        gpu.close()
        proxy.refuse_next(1)  # the same without the retry policy: the first failure is the caller's
        channel = Connection(proxy.address).channel(retries=False)
        with pytest.raises(grpc.RpcError) as failure:
            broker_pb2_grpc.GpuBrokerServiceStub(channel).Status(broker_pb2.StatusRequest(), timeout=10)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ClientError.from_rpc(failure.value).exit_code == 7
        channel.close()
    finally:
        proxy.close()


def test_step_cache_reaches_the_service_and_its_refusal_comes_back(services, tiny_models):
    assert cli(services, "load", "zc", str(tiny_models["zimage"]), "--speed", "off").returncode == 0
    try:
        refused = cli(services, "generate", "zc", "a cube", "--width", "64", "--height", "64", "--step-cache", "0.1")
        assert refused.returncode == 4 and "FAILED_PRECONDITION" in refused.stderr  # Z-Image has no block cache
        assert "FLUX.1 and Qwen-Image" in refused.stderr
    finally:
        cli(services, "unload", "zc")


def test_the_image_room_reaches_the_service_and_a_larger_image_is_refused(services, tiny_models):
    loaded = cli(services, "--json", "load", "zr", str(tiny_models["zimage"]), "--max-pixels-per-call", "64x64")
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["limits"]["maxPixelsPerCall"] == 64 * 64
    try:
        refused = cli(services, "generate", "zr", "a cube", "--width", "64", "--height", "128")
        assert refused.returncode == 4 and "FAILED_PRECONDITION" in refused.stderr, refused.stderr
        assert "max_pixels_per_call of at least 8192" in refused.stderr
    finally:
        cli(services, "unload", "zr")
    assert cli(services, "load", "zr", "/tmp/x", "--max-pixels-per-call", "big").returncode == 2
