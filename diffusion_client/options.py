"""How a client connects (address, token, TLS, retries) and the option words the client takes for proto enums."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from diffusion.v1 import common_pb2 as c
from service_kit.security import ClientSecurity, open_channel
from service_kit.server_runtime import CLIENT_OPTIONS

# gRPC's own retry policy: a call answered UNAVAILABLE before any response (a service restarting, no lease
# yet, a connection refused) is tried again with exponential backoff. Streams are retried only until their
# first message arrives; Training.watch() reconnects after that itself.
RETRY_ATTEMPTS = 5
SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "diffusion.v1.InferenceService"}, {"service": "diffusion.v1.TrainingService"},
             {"service": "diffusion.v1.GpuBrokerService"}],
    "retryPolicy": {"maxAttempts": RETRY_ATTEMPTS, "initialBackoff": "0.25s", "maxBackoff": "4s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
}]})
OPTIONS = (*CLIENT_OPTIONS, ("grpc.enable_retries", 1), ("grpc.service_config", SERVICE_CONFIG),
           # reconnect quickly to a restarted service instead of waiting out gRPC's default 20 s backoff cap
           ("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 4000))


@dataclass(frozen=True)
class Connection:
    """Where a service is and how to present ourselves. `token` is sent as 'authorization: Bearer'."""

    address: str
    token: str | None = None
    tls_ca: Path | None = None

    @classmethod
    def of(cls, address: "str | Connection", token: str | None = None) -> "Connection":
        return address if isinstance(address, Connection) else cls(address, token)

    def channel(self, retries: bool = True):
        security = ClientSecurity(self.token, self.tls_ca.read_bytes() if self.tls_ca else None)
        return open_channel(self.address, security, aio=False, options=OPTIONS if retries else CLIENT_OPTIONS)


def token_from_env() -> str | None:
    """DIFFUSION_TOKEN, or the first line of the file DIFFUSION_TOKEN_FILE names."""
    if os.environ.get("DIFFUSION_TOKEN"):
        return os.environ["DIFFUSION_TOKEN"]
    path = os.environ.get("DIFFUSION_TOKEN_FILE")
    return Path(path).read_text().strip().splitlines()[0] if path else None


def enum_value(enum, prefix: str, word: "str | int | None") -> int:
    """'bf16' -> PRECISION_BF16, 'low_vram' -> MEMORY_MODE_LOW_VRAM; an int passes through; None is unset (0)."""
    if word is None or word == "":
        return 0
    if isinstance(word, int):
        return word
    name = f"{prefix}_{word.upper().replace('-', '_')}"
    try:
        return enum.Value(name)
    except ValueError:
        words = [n.removeprefix(prefix + "_").lower() for n in enum.keys() if not n.endswith("UNSPECIFIED")]
        raise ValueError(f"{word!r} is not one of {', '.join(words)}") from None


def precision(word) -> int:
    return enum_value(c.Precision, "PRECISION", word)


def memory_mode(word) -> int:
    return enum_value(c.MemoryMode, "MEMORY_MODE", word)


def speed_mode(word) -> int:
    return enum_value(c.SpeedMode, "SPEED_MODE", word)


def family(word) -> int:
    return enum_value(c.Family, "FAMILY", word)


def model_source(where: "str | c.ModelSource") -> c.ModelSource:
    """A ModelSource from a word: 'hub:org/name[@revision]', a .gguf or .safetensors file, or a pipeline folder."""
    if isinstance(where, c.ModelSource):
        return where
    if where.startswith("hub:"):
        repo, _, revision = where.removeprefix("hub:").partition("@")
        return c.ModelSource(hub_repo=c.HubRepo(repo_id=repo, revision=revision))
    if where.endswith(".gguf"):
        return c.ModelSource(gguf=c.GgufTransformer(path=where))
    if where.endswith((".safetensors", ".ckpt")):
        return c.ModelSource(single_file=c.SingleFileCheckpoint(path=where))
    return c.ModelSource(local_dir=where)
