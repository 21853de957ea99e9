"""The edge checks every request passes before a servicer sees it: sizes, ranges, enums, required fields.

Each service declares its limits as a table keyed by message type (``Rules``); ``check`` walks a
request through its descriptor and returns every violation with the field's path, so one
INVALID_ARGUMENT names them all (google.rpc.BadRequest). Enum fields are closed here: a number
the proto does not define is refused. ``unbounded_fields`` lists the strings, bytes and repeated
fields a table forgot, so a test keeps every one of them bounded.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from service_kit.errors import FieldViolation, InvalidArgument

_INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)


@dataclass(frozen=True)
class Limit:
    """What one field accepts. Strings count characters; `max_items` bounds a repeated field."""

    max_len: int | None = None
    max_items: int | None = None
    min: float | None = None
    max: float | None = None
    required: bool = False
    pattern: str | None = None  # a regular expression the whole value must match (fullmatch)
    pattern_says: str = ""  # the pattern in words, for the error
    reason: str = ""  # the ErrorInfo reason when this field is the first at fault (default INVALID_REQUEST)

    def describe(self) -> str:
        """The limit in the words the proto comments use."""
        parts = []
        if self.required:
            parts.append("required")
        if self.max_len is not None:
            parts.append(f"at most {self.max_len} characters")
        if self.max_items is not None:
            parts.append(f"at most {self.max_items} items")
        if self.min is not None and self.max is not None:
            parts.append(f"{self.min:g} to {self.max:g}")
        elif self.min is not None:
            parts.append(f">= {self.min:g}")
        elif self.max is not None:
            parts.append(f"<= {self.max:g}")
        if self.pattern_says:
            parts.append(self.pattern_says)
        return "; ".join(parts)


@dataclass(frozen=True)
class Rules:
    """Limits per field of one message type, and the oneofs that must be set."""

    fields: Mapping[str, Limit] = field(default_factory=dict)
    required_oneofs: tuple[str, ...] = ()
    oneof_reasons: Mapping[str, str] = field(default_factory=dict)


def check(message: Message, table: Mapping[str, Rules], *, max_depth: int = 8) -> list[FieldViolation]:
    """Every violation of `table` in `message`, each with its field path (`adapters[2].weight`)."""
    out: list[FieldViolation] = []
    _walk(message, table, "", out, max_depth)
    return out


def enforce(message: Message, table: Mapping[str, Rules]) -> None:
    """Raises INVALID_ARGUMENT naming every violation; returns quietly when there is none."""
    violations = check(message, table)
    if violations:
        head = "; ".join(f"{v.field}: {v.description}" for v in violations[:5])
        more = f" (and {len(violations) - 5} more)" if len(violations) > 5 else ""
        raise InvalidArgument(f"{message.DESCRIPTOR.name} is invalid: {head}{more}",
                              reason=violations[0].reason or "INVALID_REQUEST", violations=violations)


def _walk(message: Message, table: Mapping[str, Rules], prefix: str, out: list[FieldViolation], depth: int) -> None:
    desc = message.DESCRIPTOR
    if depth <= 0:
        out.append(FieldViolation(prefix.rstrip(".") or desc.name, "nested too deeply"))
        return
    rules = table.get(desc.full_name, Rules())
    for oneof in rules.required_oneofs:
        if message.WhichOneof(oneof) is None:
            names = ", ".join(f.name for f in desc.oneofs_by_name[oneof].fields)
            out.append(FieldViolation(prefix + oneof, f"required: set one of {names}",
                                      rules.oneof_reasons.get(oneof, "")))
    for fd in desc.fields:
        path = prefix + fd.name
        limit = rules.fields.get(fd.name, Limit())
        if fd.is_repeated:
            values = getattr(message, fd.name)
            if limit.required and not len(values):
                out.append(FieldViolation(path, "required", limit.reason))
            if limit.max_items is not None and len(values) > limit.max_items:
                out.append(FieldViolation(path, f"at most {limit.max_items} items, got {len(values)}", limit.reason))
                continue  # the items of an oversized list are not worth reading one by one
            for i, value in enumerate(values):
                _one(fd, value, limit, f"{path}[{i}]", table, out, depth)
            continue
        if fd.message_type is not None and not message.HasField(fd.name):
            if limit.required:
                out.append(FieldViolation(path, "required", limit.reason))
            continue
        _one(fd, getattr(message, fd.name), limit, path, table, out, depth)


def _one(fd: FieldDescriptor, value, limit: Limit, path: str, table, out: list[FieldViolation], depth: int) -> None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if _is_well_known(fd.message_type):
            _well_known(value, limit, path, out)
        else:
            _walk(value, table, path + ".", out, depth - 1)
        return
    if fd.type == FieldDescriptor.TYPE_ENUM:
        if fd.enum_type.values_by_number.get(value) is None:
            known = ", ".join(str(v.number) for v in fd.enum_type.values)
            out.append(FieldViolation(path, f"{value} is not a {fd.enum_type.name} value ({known})",
                                      limit.reason or "UNKNOWN_ENUM_VALUE"))
        elif limit.required and value == 0:
            out.append(FieldViolation(path, "required", limit.reason))
        return
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        if limit.required and not (value.strip() if isinstance(value, str) else value):
            out.append(FieldViolation(path, "required", limit.reason))
            return
        if limit.max_len is not None and len(value) > limit.max_len:
            out.append(FieldViolation(path, f"at most {limit.max_len} characters, got {len(value)}", limit.reason))
            return
        if isinstance(value, str) and "\x00" in value:
            out.append(FieldViolation(path, "must not contain NUL characters", limit.reason))
            return
        if limit.pattern and value and not re.fullmatch(limit.pattern, value):
            out.append(FieldViolation(path, limit.pattern_says or f"must match {limit.pattern}", limit.reason))
        return
    if fd.type in _FLOATS and not math.isfinite(value):
        out.append(FieldViolation(path, f"must be a finite number, got {value}", limit.reason))
        return
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return
    if limit.required and not value:
        out.append(FieldViolation(path, "required", limit.reason))
    elif (limit.min is not None and value < limit.min) or (limit.max is not None and value > limit.max):
        out.append(FieldViolation(path, f"must be {Limit(min=limit.min, max=limit.max).describe()}, got {value}",
                                  limit.reason))


def _is_well_known(desc: Descriptor) -> bool:
    return desc.full_name in ("google.protobuf.Duration", "google.protobuf.Timestamp")


def _well_known(value, limit: Limit, path: str, out: list[FieldViolation]) -> None:
    """Durations and timestamps: seconds within the limit (or within what a Duration may hold)."""
    seconds = value.seconds + value.nanos / 1e9
    if not -315_576_000_000 <= value.seconds <= 315_576_000_000 or not -999_999_999 <= value.nanos <= 999_999_999:
        out.append(FieldViolation(path, "is not a valid duration"))
    elif (limit.min is not None and seconds < limit.min) or (limit.max is not None and seconds > limit.max):
        out.append(FieldViolation(path, f"must be {Limit(min=limit.min, max=limit.max).describe()} seconds, "
                                        f"got {seconds:g}"))


def unbounded_fields(desc: Descriptor, table: Mapping[str, Rules], seen: set[str] | None = None) -> list[str]:
    """Strings, bytes and repeated fields reachable from `desc` that `table` gives no size limit."""
    seen = set() if seen is None else seen
    if desc.full_name in seen or _is_well_known(desc):
        return []
    seen.add(desc.full_name)
    rules = table.get(desc.full_name, Rules())
    missing = []
    for fd in desc.fields:
        limit = rules.fields.get(fd.name, Limit())
        if fd.is_repeated and limit.max_items is None:
            missing.append(f"{desc.full_name}.{fd.name} (items)")
        if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES) and limit.max_len is None:
            missing.append(f"{desc.full_name}.{fd.name} (length)")
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            missing += unbounded_fields(fd.message_type, table, seen)
    return missing


def largest_request_bytes(desc: Descriptor, table: Mapping[str, Rules], depth: int = 4) -> int:
    """An upper bound on the wire size of a request within `table` (4 bytes a character, nesting to `depth`)."""
    if depth <= 0 or _is_well_known(desc):
        return 16
    rules = table.get(desc.full_name, Rules())
    total = 0
    for fd in desc.fields:
        limit = rules.fields.get(fd.name, Limit())
        items = limit.max_items if fd.is_repeated else 1
        if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            one = 4 * (limit.max_len or 0) + 8
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            one = largest_request_bytes(fd.message_type, table, depth - 1) + 8
        else:
            one = 12
        total += (items or 0) * one
    return total
