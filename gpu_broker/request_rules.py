"""The broker's request limits, checked at the edge before the lease book sees a request.

Each limit is also written in broker.proto's comments; tests/service_kit/test_request_limits.py
checks both that every string and list is bounded and that the comments say so.
"""
from __future__ import annotations

from service_kit.request_limits import Limit, Rules

CLIENT_ID = r"[A-Za-z0-9][A-Za-z0-9._:/@-]*"
OPAQUE_ID = Limit(max_len=64)

RULES: dict[str, Rules] = {
    "diffusion.v1.Holder": Rules({
        "client_id": Limit(max_len=128, pattern=CLIENT_ID,
                           pattern_says="letters, digits, '.', '_', ':', '/', '@' or '-', starting with a letter "
                                        "or digit"),
        "purpose": Limit(max_len=256),
        "pid": Limit(min=0, reason="BAD_PID"),
    }),
    "diffusion.v1.AcquireRequest": Rules({"holder": Limit(required=True, reason="MISSING_CLIENT_ID"),
                                          "reclaim_lease_id": OPAQUE_ID}),
    "diffusion.v1.ReleaseRequest": Rules({"lease_id": Limit(max_len=64, required=True, reason="MISSING_LEASE_ID")}),
    "diffusion.v1.SetBusyRequest": Rules({"lease_id": Limit(max_len=64, required=True, reason="MISSING_LEASE_ID")}),
    "diffusion.v1.CancelRequest": Rules({"request_id": OPAQUE_ID, "lease_id": OPAQUE_ID,
                                         "reason": Limit(max_len=256)},
                                        required_oneofs=("target",), oneof_reasons={"target": "MISSING_TARGET"}),
}
