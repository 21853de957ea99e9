"""The inference service from Python: load, generate (images one per event), unload, models, status."""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import grpc

from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from diffusion_client import options as opt
from diffusion_client.errors import ClientError
from diffusion_client.service_client import ServiceClient

EXTENSIONS = {"image/png": "png", "image/webp": "webp", "image/jpeg": "jpg", "application/octet-stream": "rgb"}


@dataclass
class Generation:
    """A finished generation: its images (in seed order) and the summary that ended its stream."""

    generation_id: str
    images: list[pb.GeneratedImage] = field(default_factory=list)
    result: pb.GenerateResult = field(default_factory=pb.GenerateResult)

    @property
    def timings(self) -> pb.GenerationTimings:
        return self.result.timings

    @property
    def resolved(self):
        return self.result.resolved

    def pil(self) -> list:
        """The images as PIL images (raw RGB8 ones are shaped by their width and height)."""
        from PIL import Image

        return [Image.frombytes("RGB", (i.width, i.height), i.data) if i.mime_type == "application/octet-stream"
                else Image.open(io.BytesIO(i.data)) for i in self.images]

    def save(self, directory: "str | Path", stem: str = "image") -> list[Path]:
        """Writes each image as DIRECTORY/STEM-SEED.EXT; returns the paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for image in self.images:
            path = out / f"{stem}-{image.seed}.{EXTENSIONS.get(image.mime_type, 'bin')}"
            path.write_bytes(image.data)
            paths.append(path)
        return paths


def collect(events: "Iterator[pb.GenerateResponse]",
            on_event: Callable[[pb.GenerateResponse], None] | None = None) -> Generation:
    """Drains a Generate stream into a Generation, calling on_event for each event on the way."""
    generation = None
    for event in events:
        if on_event is not None:
            on_event(event)
        generation = generation or Generation(event.generation_id)
        kind = event.WhichOneof("event")
        if kind == "image":
            generation.images.append(event.image)
        elif kind == "result":
            generation.result = event.result
            return generation
    raise ClientError(grpc.StatusCode.UNAVAILABLE, "the Generate stream ended before its result", "STREAM_ENDED")


class Inference(ServiceClient):
    STUB = inference_pb2_grpc.InferenceServiceStub

    # ---- load ----------------------------------------------------------------------------

    def load_request(self, model_id: str, source, *, transformer_precision=None, compute_precision=None,
                     text_encoder_precision=None, memory_mode=None, speed_mode=None, device_index: int | None = None,
                     keep_alive_s: float | None = None, variant: str = "", **fields) -> pb.LoadRequest:
        """A LoadRequest from option words ('fp8', 'low_vram', 'max'); other LoadRequest fields pass through.
        keep_alive_s: idle seconds before the service unloads it (negative: never; 0: after each generation)."""
        req = pb.LoadRequest(model_id=model_id, source=opt.model_source(source),
                             transformer_precision=opt.precision(transformer_precision),
                             compute_precision=opt.precision(compute_precision),
                             text_encoder_precision=opt.precision(text_encoder_precision),
                             memory_mode=opt.memory_mode(memory_mode), speed_mode=opt.speed_mode(speed_mode), **fields)
        if variant:
            if req.source.WhichOneof("source") != "hub_repo":
                raise ValueError("a weight variant is for hub repos (hub:ORG/NAME)")
            req.source.hub_repo.variant = variant
        if device_index is not None:
            req.device_index = device_index
        if keep_alive_s is not None:
            req.keep_alive.FromNanoseconds(int(keep_alive_s * 1e9))
        return req

    def load(self, model_id: str, source, *, timeout: float | None = None, **options) -> Iterator[pb.LoadResponse]:
        """The Load stream: phases with download/transfer progress, ending with the loaded model."""
        return self._stream(self.stub.Load, self.load_request(model_id, source, **options), timeout)

    def load_model(self, model_id: str, source, *, on_event=None, timeout: float | None = None,
                   **options) -> pb.LoadedModel:
        """Loads and waits; returns the loaded model with its resolved settings."""
        last = None
        for last in self.load(model_id, source, timeout=timeout, **options):
            if on_event is not None:
                on_event(last)
        return last.result

    # ---- generate ------------------------------------------------------------------------

    def generate_request(self, model_id: str, prompt: str, *, output_format=None, adapters=(), step_cache=None,
                         **fields):
        """A GenerateRequest; output_format takes 'png', 'webp', 'jpeg' or 'raw_rgb8'; adapters (id, weight);
        step_cache a First-Block Cache threshold (opt-in; it changes the image)."""
        if step_cache is not None:
            fields["step_cache"] = pb.StepCache(mode=pb.STEP_CACHE_MODE_FIRST_BLOCK, threshold=step_cache)
        return pb.GenerateRequest(model_id=model_id, prompt=prompt,
                                  output_format=opt.enum_value(pb.ImageFormat, "IMAGE_FORMAT", output_format),
                                  adapters=[pb.AdapterRef(adapter_id=a, weight=w) for a, w in adapters], **fields)

    def stream(self, model_id: str, prompt: str, *, timeout: float | None = None,
               **fields) -> Iterator[pb.GenerateResponse]:
        """The Generate stream: queue position, steps, one event per image, then the result."""
        return self._stream(self.stub.Generate, self.generate_request(model_id, prompt, **fields), timeout)

    def generate(self, model_id: str, prompt: str, *, on_event=None, timeout: float | None = None,
                 **fields) -> Generation:
        """Generates and waits; on_event sees every event (progress bars)."""
        return collect(self.stream(model_id, prompt, timeout=timeout, **fields), on_event)

    def cancel(self, generation_id: str) -> None:
        self._call(self.stub.CancelGeneration, pb.CancelGenerationRequest(generation_id=generation_id))

    # ---- models and status ---------------------------------------------------------------

    def unload(self, model_id: str = "") -> pb.UnloadResponse:
        return self._call(self.stub.Unload, pb.UnloadRequest(model_id=model_id))

    def models(self) -> pb.ListModelsResponse:
        return self._call(self.stub.ListModels, pb.ListModelsRequest())

    def status(self) -> pb.GetInferenceStatusResponse:
        return self._call(self.stub.GetInferenceStatus, pb.GetInferenceStatusRequest())

    def capabilities(self) -> pb.GetCapabilitiesResponse:
        return self._call(self.stub.GetCapabilities, pb.GetCapabilitiesRequest())
