"""A holder in its own process: acquires through the client library, prints its lease id, then holds.

Tests SIGKILL it to prove the broker frees a dead holder's lease.
"""
import asyncio
import sys

from gpu_broker.client import BrokerClient, LeaseRequest


async def main(address: str, client_id: str) -> None:
    async with BrokerClient(address) as broker:
        async with broker.lease(LeaseRequest(client_id=client_id, purpose="hold until killed")) as lease:
            print(lease.lease_id, flush=True)
            await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
