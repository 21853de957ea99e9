"""SIGTERM drains: the running generation finishes within the grace, new calls answer UNAVAILABLE (retryable)."""
import signal
import time

import grpc

from diffusion.v1 import inference_pb2 as pb
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.inference_service.harness import BackgroundStream, InferenceClient


def test_a_running_generation_finishes_and_new_calls_are_told_to_retry(tiny_models):
    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, "--shutdown-grace", "60", timeout=180)
    client = InferenceClient(proc.address)
    try:
        client.load("tiny-z", tiny_models["zimage"])
        running = BackgroundStream(client.stub.Generate(pb.GenerateRequest(
            model_id="tiny-z", prompt="a card", width=64, height=64, steps=200, seeds=[1]), timeout=120))
        assert running.progress.wait(60)
        proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        refused = None
        try:
            client.generate("tiny-z", timeout=10)
        except grpc.RpcError as e:
            refused = e
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert error_info(refused).reason == "DRAINING"
        assert running.done.wait(60) and running.error is None, running.error
        assert running.events[-1].WhichOneof("event") == "result"
        assert proc.proc.wait(60) == 0
    finally:
        client.close()
        proc.stop()
    errors = [e for e in proc.log_events() if e.get("level") == "error"]
    assert errors == [] and not any("CancelledError" in line for line in proc.stderr_lines)
