import pytest

from tests.inference_service.harness import InferenceClient


@pytest.fixture(scope="module")
def inference_service():
    """A real inference service process (no broker), compile through aot_eager as CPU tests should."""
    from service_kit.service_process import start_service

    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    yield proc, client
    client.close()
    proc.stop()
