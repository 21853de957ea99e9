"""What every client of one service shares: its channel (address, token, TLS, retry policy), its stub, closing,
and calls whose failures come out as ClientError."""
from __future__ import annotations

import grpc

from diffusion_client.errors import ClientError
from diffusion_client.options import Connection


class ServiceClient:
    STUB: type  # the generated stub class of the service

    def __init__(self, address: "str | Connection", *, token: str | None = None):
        self.connection = Connection.of(address, token)
        self.channel = self.connection.channel()
        self.stub = self.STUB(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _call(method, request, timeout: float | None = 30):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise ClientError.from_rpc(e) from None

    @staticmethod
    def _stream(method, request, timeout: float | None):
        try:
            yield from method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise ClientError.from_rpc(e) from None
