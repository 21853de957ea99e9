"""Seconds to protobuf Timestamps and Durations, the one conversion every service's edge uses."""
from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2


def timestamp(t: float) -> timestamp_pb2.Timestamp:
    """A Unix time in seconds as a Timestamp."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def duration(seconds: float) -> duration_pb2.Duration:
    """Seconds as a Duration; a negative span (clock skew between two readings) reads as zero."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(max(0.0, seconds) * 1e9))
    return d
