"""On a real GPU: the broker reads NVML and says when a holder's process uses more than its lease."""
import asyncio

import pytest

from gpu_broker.client import BrokerClient, LeaseRequest

pytestmark = pytest.mark.gpu
G = 2**30


def test_a_holder_using_more_than_its_lease_is_said_on_watch(start_broker):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    proc, client = start_broker("--usage-interval", "0.2", fake_devices=None)
    timeline = client.timeline()

    async def scenario():
        async with BrokerClient(proc.address) as broker:
            async with broker.lease(LeaseRequest("inference-0", memory_bytes=G, device_index=0)):
                block = torch.empty(3 * G, dtype=torch.uint8, device="cuda:0")  # 3 GiB under a 1 GiB lease
                event = await asyncio.to_thread(timeline.wait_for, "OVER_LEASE", 20)
                del block
                return event

    event = asyncio.run(scenario())
    assert event.transition.holder.client_id == "inference-0" and "holds 1.0 GiB" in event.transition.detail
