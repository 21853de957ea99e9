"""Blocking helpers for talking to a real inference service over loopback gRPC."""
from __future__ import annotations

import io
import threading

import grpc

from diffusion.v1 import common_pb2
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from diffusion_client.inference import Generation, collect
from service_kit.server_runtime import CLIENT_OPTIONS
from tests.service_flags import MODEL_ROOTS


class InferenceClient:
    # aot_eager: the CPU compile backend for tests; tiny linears must still be quantisable.
    TEST_FLAGS = ("--compile-backend", "aot_eager", "--quant-min-features", "16", "--warmup-resolution", "64",
                  "--compile-cache-dir", "/tmp/diffusion-services-test-inductor", *MODEL_ROOTS)

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        self.stub = inference_pb2_grpc.InferenceServiceStub(self.channel)

    def load(self, model_id: str, path, **fields) -> list[pb.LoadResponse]:
        req = pb.LoadRequest(model_id=model_id, source=common_pb2.ModelSource(local_dir=str(path)), **fields)
        return list(self.stub.Load(req, timeout=300))

    def load_request(self, req: pb.LoadRequest) -> list[pb.LoadResponse]:
        return list(self.stub.Load(req, timeout=300))

    def generate(self, model_id: str, prompt: str = "a red cube", *, timeout: float = 120, **fields):
        req = pb.GenerateRequest(model_id=model_id, prompt=prompt, **{"width": 64, "height": 64, "steps": 2, **fields})
        return list(self.stub.Generate(req, timeout=timeout))

    def generate_stream(self, model_id: str, prompt: str = "a red cube", **fields):
        req = pb.GenerateRequest(model_id=model_id, prompt=prompt, **{"width": 64, "height": 64, **fields})
        return self.stub.Generate(req)

    def status(self) -> pb.GetInferenceStatusResponse:
        return self.stub.GetInferenceStatus(pb.GetInferenceStatusRequest(), timeout=5)

    def close(self):
        self.channel.close()


def result_of(events) -> Generation:
    """The images (one per `image` event) and the summary that ended the stream."""
    assert events[-1].WhichOneof("event") == "result", [e.WhichOneof("event") for e in events]
    generation = collect(iter(events))
    assert len(generation.images) == generation.result.image_count
    return generation


def progress_steps(events) -> list[int]:
    return [e.progress.step for e in events if e.WhichOneof("event") == "progress"]


def decode(image: pb.GeneratedImage):
    from PIL import Image

    return Image.open(io.BytesIO(image.data))


class BackgroundStream:
    """Reads a server stream on a thread, so a test can act while it runs."""

    def __init__(self, call):
        self.call = call
        self.events: list = []
        self.error: grpc.RpcError | None = None
        self.progress = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for event in self.call:
                self.events.append(event)
                if "event" in event.DESCRIPTOR.oneofs_by_name and event.WhichOneof("event") == "progress":
                    self.progress.set()
        except grpc.RpcError as e:
            self.error = e
        self.done.set()
