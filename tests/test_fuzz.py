"""Every method of the live services (and of the router in front of inference), fed hypothesis-drawn requests built from their descriptors (valid,
edge and hostile values, undefined enum numbers, huge strings and lists, raw bytes): no answer is UNKNOWN or
INTERNAL. tools/fuzz_requests.py runs the same strategies at 10,000 cases per service; docs/security.md has
its counts."""
from collections import Counter

import grpc
import pytest

from tools.fuzz_requests import fuzz_method, services, start_stack

CASES_PER_METHOD = 25


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    procs, extra = start_stack(tmp_path_factory.mktemp("fuzz"))
    yield dict(zip(("broker", "inference", "training", "router"), (p.address for p in procs))), extra
    for proc in reversed(procs):
        proc.stop()


@pytest.mark.parametrize("service", ["broker", "inference", "training", "router"])
def test_no_method_answers_unknown_or_internal(stack, service):
    address, extra = stack
    counts: Counter = Counter()
    with grpc.insecure_channel(address[service]) as channel:
        for i, (key, _, method, cls, streaming) in enumerate(services(address)):
            if key == service:
                before = sum(counts.values())
                fuzz_method(channel, method, cls, streaming, CASES_PER_METHOD, counts, extra, seed=i)
                assert sum(counts.values()) > before, method
    assert counts["UNKNOWN"] == 0 and counts["INTERNAL"] == 0, dict(counts)
    assert counts["INVALID_ARGUMENT"] > 0, dict(counts)  # the hostile values did reach the edge
