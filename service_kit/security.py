"""How a server accepts callers and how a client presents itself: bearer tokens and TLS (mTLS optional).

Servers take ``--auth-token-file`` (service_kit.auth) and ``--tls-cert``/``--tls-key`` (with
``--tls-client-ca`` every client must show a certificate signed by that CA). A service that calls
the broker takes ``--broker-token-file`` and ``--broker-tls-ca`` (plus ``--broker-tls-cert``/
``--broker-tls-key`` for mTLS). Every channel our code opens goes through ``open_channel``, so the
keepalive, the message limits and the credentials are set in one place.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from service_kit import tracing
from service_kit.auth import TokenBook, TokenFileError, read_token_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSecurity:
    tokens: TokenBook | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tls_client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert is None:
            return None
        return grpc.ssl_server_credentials([(self.tls_key, self.tls_cert)], root_certificates=self.tls_client_ca,
                                           require_client_auth=self.tls_client_ca is not None)

    def warn_if_open(self, listen: str) -> None:
        """An address other hosts can reach, with no token check, is worth a loud line in the log."""
        host = listen.rsplit(":", 1)[0].strip("[]")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and self.tokens is None:
            log.warning("listening beyond loopback without --auth-token-file: any host that reaches this port can "
                        "call every method", extra={"fields": {"event": "security.open", "listen": listen}})


@dataclass(frozen=True)
class ClientSecurity:
    token: str | None = None
    tls_ca: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None

    @property
    def uses_tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


INSECURE = ClientSecurity()


class _TokenAio:
    def __init__(self, metadata):
        self._metadata = metadata

    def _with_token(self, details):
        metadata = tuple(details.metadata or ()) + self._metadata
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready)


# grpc.aio files an interceptor under the first call kind it implements, so each kind gets its own class.
class _TokenAioUnary(_TokenAio, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _TokenAioStream(_TokenAio, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _TokenSync(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata):
        self._metadata = metadata

    def _with_token(self, details):
        return _SyncDetails(details.method, details.timeout, tuple(details.metadata or ()) + self._metadata,
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def open_channel(target: str, security: ClientSecurity = INSECURE, *, aio: bool = True, options=None):
    """A channel with our keepalive and message limits, TLS when configured, and the token on every call."""
    from service_kit.server_runtime import CLIENT_OPTIONS

    options = CLIENT_OPTIONS if options is None else options
    creds = None
    if security.uses_tls:
        creds = grpc.ssl_channel_credentials(root_certificates=security.tls_ca, private_key=security.tls_key,
                                             certificate_chain=security.tls_cert)
    meta = security.metadata()
    if aio:
        tokens = [_TokenAioUnary(meta), _TokenAioStream(meta)] if meta else []
        interceptors = [*tracing.client_interceptors(), *tokens] or None
        if creds is not None:
            return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    channel = grpc.secure_channel(target, creds, options=options) if creds is not None else \
        grpc.insecure_channel(target, options=options)
    return grpc.intercept_channel(channel, _TokenSync(meta)) if meta else channel


# ---- command-line flags, shared by the three services ----------------------------------------

def add_server_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("security")
    g.add_argument("--auth-token-file", type=Path,
                   help="bearer tokens this server accepts (identity, role, priority ceiling, sha256 per line); "
                        "without it every caller is an anonymous admin")
    g.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS (needs --tls-key)")
    g.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    g.add_argument("--tls-client-ca", type=Path, help="PEM CA: clients must present a certificate it signed (mTLS)")


def add_client_flags(parser: argparse.ArgumentParser, peer: str = "broker", what: str = "the broker") -> None:
    """--PEER-token-file, --PEER-tls-ca, --PEER-tls-cert, --PEER-tls-key: how this service calls `what`."""
    g = parser.add_argument_group(f"calling {what}")
    g.add_argument(f"--{peer}-token-file", type=Path, help=f"this service's own token for {what} (one line)")
    g.add_argument(f"--{peer}-tls-ca", type=Path, help=f"PEM CA that signed the certificate of {what}: talk TLS")
    g.add_argument(f"--{peer}-tls-cert", type=Path, help=f"PEM client certificate, when {what} wants mTLS")
    g.add_argument(f"--{peer}-tls-key", type=Path, help=f"PEM key of --{peer}-tls-cert")


def server_security(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerSecurity:
    """The flags read and checked at start-up: a bad file stops the service before it listens."""
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    try:
        tokens = TokenBook.load(args.auth_token_file) if args.auth_token_file else None
        read = (lambda p: Path(p).read_bytes() if p else None)
        return ServerSecurity(tokens, read(args.tls_cert), read(args.tls_key), read(args.tls_client_ca))
    except (OSError, TokenFileError) as e:
        parser.error(str(e))


def client_security(args: argparse.Namespace, parser: argparse.ArgumentParser, peer: str = "broker") -> ClientSecurity:
    """What add_client_flags(parser, peer) read, checked: a bad file stops the service before it listens."""
    arg = lambda name: getattr(args, f"{peer}_{name}")  # noqa: E731
    if (arg("tls_cert") is None) != (arg("tls_key") is None):
        parser.error(f"--{peer}-tls-cert and --{peer}-tls-key go together")
    try:
        read = (lambda p: Path(p).read_bytes() if p else None)
        token = read_token_file(arg("token_file")) if arg("token_file") else None
        return ClientSecurity(token, read(arg("tls_ca")), read(arg("tls_cert")), read(arg("tls_key")))
    except (OSError, TokenFileError) as e:
        parser.error(str(e))
