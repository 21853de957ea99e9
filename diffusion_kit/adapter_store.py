"""The adapter store: LoRA adapters by id, shared by the training service (publishes) and inference (loads).

Layout, one folder per adapter:
    <root>/<adapter_id>/pytorch_lora_weights.safetensors   diffusers/peft layout
    <root>/<adapter_id>/adapter.json                        the sidecar (family, base, rank, alpha, LoRA config, ...)
    <root>/<adapter_id>/pins/<host>.<pid>.<holder>          one file per process that has it loaded
Publishing is atomic (a staging folder renamed into place). A pinned adapter cannot be deleted.

A pin is a heartbeat file: its host (the pod, in Kubernetes), process id, holder and an expiry that the
holder renews (`renew_pins`, every third of PIN_TTL_S). Any process that shares the store, on any host or
pod, counts a pin live until it expires; a process on the pin's own host also drops it at once when its
process is gone. So a training pod's DeleteAdapter sees an inference pod's pins without sharing its PID
namespace.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from service_kit.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, clip

WEIGHTS = "pytorch_lora_weights.safetensors"
SIDECAR = "adapter.json"
ADAPTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: '$' alone let "id\n" through
PIN_TTL_S = 60.0  # a pin not renewed for this long is stale on every host


@dataclass(frozen=True)
class AdapterInfo:
    adapter_id: str
    family: str  # FamilySpec.key
    base: str
    rank: int
    alpha: float
    lora_config: dict
    steps: int = 0
    resolution: int = 0
    trigger_words: tuple[str, ...] = ()
    job_id: str = ""
    created: float = field(default_factory=time.time)
    size_bytes: int = 0
    owner: str = ""  # the identity whose job published it; "" for adapters published before owners were kept

    def to_json(self) -> str:
        data = asdict(self)
        data["trigger_words"] = list(self.trigger_words)
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, size_bytes: int = 0) -> "AdapterInfo":
        data = json.loads(text)
        data["trigger_words"] = tuple(data.get("trigger_words", ()))
        data["size_bytes"] = size_bytes
        return cls(**data)


def check_adapter_id(adapter_id: str) -> None:
    if not isinstance(adapter_id, str) or not ADAPTER_ID.fullmatch(adapter_id):
        raise InvalidArgument(f"adapter ids are 1-128 letters, digits, '.', '_' or '-', got {clip(adapter_id)}",
                              reason="BAD_ADAPTER_ID")


class AdapterStore:
    def __init__(self, root: Path, *, host: str | None = None, pin_ttl_s: float = PIN_TTL_S):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.host = host or socket.gethostname()  # where this process's pins say it runs
        self.pin_ttl_s = pin_ttl_s
        self._pinned: set[tuple[str, str]] = set()  # (adapter id, holder) this process holds, to renew

    def path(self, adapter_id: str) -> Path:
        check_adapter_id(adapter_id)
        return self.root / adapter_id

    def get(self, adapter_id: str) -> AdapterInfo:
        folder = self.path(adapter_id)
        sidecar = folder / SIDECAR
        if not sidecar.is_file() or not (folder / WEIGHTS).is_file():
            raise NotFound(f"no adapter {adapter_id!r} in the store {self.root}", reason="ADAPTER_NOT_FOUND",
                           metadata={"adapter_id": adapter_id})
        return AdapterInfo.from_json(sidecar.read_text(), (folder / WEIGHTS).stat().st_size)

    def list(self) -> list[AdapterInfo]:
        out = []
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(".") or not (folder / SIDECAR).is_file():
                continue
            out.append(self.get(folder.name))
        return out

    def publish(self, info: AdapterInfo, weights_file: Path, *, replace: bool = False) -> AdapterInfo:
        """Moves weights and a sidecar into place in one rename; a reader never sees half an adapter."""
        target = self.path(info.adapter_id)
        if target.exists() and not replace:
            raise FailedPrecondition(f"adapter {info.adapter_id!r} already exists; choose another id",
                                     reason="ADAPTER_EXISTS")
        staging = self.root / f".staging-{uuid.uuid4().hex}"
        staging.mkdir()
        shutil.copyfile(weights_file, staging / WEIGHTS)
        (staging / SIDECAR).write_text(info.to_json())
        if target.exists():
            self._refuse_if_pinned(info.adapter_id, "replace")
            trash = self.root / f".trash-{uuid.uuid4().hex}"
            target.rename(trash)
            shutil.rmtree(trash)
        staging.rename(target)
        return self.get(info.adapter_id)

    def delete(self, adapter_id: str, caller=None) -> AdapterInfo:
        """Removes an adapter; `caller` (service_kit.auth.Caller) must be its owner or an admin."""
        info = self.get(adapter_id)
        if caller is not None and not caller.may_act_on(info.owner):
            raise PermissionDenied(f"adapter {adapter_id!r} was published by {info.owner or 'an unknown identity'}; "
                                   "only it or an admin may delete it", reason="NOT_OWNER")
        self._refuse_if_pinned(adapter_id, "delete")
        trash = self.root / f".trash-{uuid.uuid4().hex}"
        self.path(adapter_id).rename(trash)
        shutil.rmtree(trash)
        return info

    # ---- pins: which live processes have an adapter loaded ------------------------------

    def _pin_path(self, adapter_id: str, holder: str) -> Path:
        return self.path(adapter_id) / "pins" / f"{self.host}.{os.getpid()}.{holder}"

    def pin(self, adapter_id: str, holder: str) -> None:
        path = self._pin_path(adapter_id, holder)
        path.parent.mkdir(exist_ok=True)
        self._write_pin(path, holder)
        self._pinned.add((adapter_id, holder))

    def _write_pin(self, path: Path, holder: str) -> None:
        body = {"host": self.host, "pid": os.getpid(), "holder": holder, "expires": time.time() + self.pin_ttl_s}
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)  # a reader never sees half a pin

    def renew_pins(self) -> int:
        """Pushes the expiry of every pin this process holds; returns how many. Call every third of the TTL."""
        renewed = 0
        for adapter_id, holder in list(self._pinned):
            path = self._pin_path(adapter_id, holder)
            if path.parent.is_dir():
                self._write_pin(path, holder)
                renewed += 1
        return renewed

    def unpin(self, adapter_id: str, holder: str) -> None:
        self._pinned.discard((adapter_id, holder))
        try:
            self._pin_path(adapter_id, holder).unlink()
        except FileNotFoundError:
            pass

    def live_pins(self, adapter_id: str) -> list[str]:
        """The holders with a live pin, from any host; stale pins are removed on the way."""
        pins = self.path(adapter_id) / "pins"
        if not pins.is_dir():
            return []
        live, now = [], time.time()
        for pin in pins.iterdir():
            if pin.name.startswith("."):
                continue
            try:
                body = json.loads(pin.read_text())
                stale = body["expires"] < now or (body["host"] == self.host and not _alive(int(body["pid"])))
            except (OSError, ValueError, KeyError, TypeError):
                body, stale = None, True  # unreadable, or left by an older layout
            if stale:
                pin.unlink(missing_ok=True)
            else:
                live.append(body["holder"])
        return live

    def _refuse_if_pinned(self, adapter_id: str, what: str) -> None:
        holders = self.live_pins(adapter_id)
        if holders:
            raise FailedPrecondition(f"cannot {what} adapter {adapter_id!r}: loaded by {', '.join(sorted(holders))}; "
                                     "unload it there first", reason="ADAPTER_IN_USE")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
