"""The resolved-settings record: what was asked, what runs, where it came from, and why."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from diffusion.v1 import common_pb2


class Source(Enum):
    AUTO = common_pb2.SETTING_SOURCE_AUTO
    EXPLICIT = common_pb2.SETTING_SOURCE_EXPLICIT
    DEFAULT = common_pb2.SETTING_SOURCE_DEFAULT


class Status(Enum):
    APPLIED = common_pb2.SETTING_STATUS_APPLIED
    FELL_BACK = common_pb2.SETTING_STATUS_FELL_BACK
    UNSUPPORTED = common_pb2.SETTING_STATUS_UNSUPPORTED


@dataclass(frozen=True)
class Resolved:
    control: str
    requested: str
    applied: str
    source: Source
    status: Status = Status.APPLIED
    reason: str = ""

    def __post_init__(self):
        if self.status is not Status.APPLIED and not self.reason:
            raise ValueError(f"{self.control}: a fallback or unsupported setting must say why")

    def to_proto(self) -> common_pb2.ResolvedSetting:
        return common_pb2.ResolvedSetting(control=self.control, requested=self.requested, applied=self.applied,
                                          source=self.source.value, status=self.status.value, reason=self.reason)

    def to_dict(self) -> dict:
        """The record as JSON-ready data, in the ResolvedSetting message's JSON form (stored job events)."""
        return {"control": self.control, "requested": self.requested, "applied": self.applied,
                "source": common_pb2.SettingSource.Name(self.source.value),
                "status": common_pb2.SettingStatus.Name(self.status.value), "reason": self.reason}

    def fell_back(self) -> bool:
        return self.status is Status.FELL_BACK
