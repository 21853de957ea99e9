"""Who is calling: bearer tokens named in a token file, the caller's role and priority ceiling.

The token file (``--auth-token-file``), one identity per line, ``#`` starts a comment:

    # identity     role   max_priority  sha256 of the token
    inference-0    user   100           3f0a...
    ops            admin  2147483647    9bc1...

Only the SHA-256 of each token is stored, so the file does not hand out the tokens.
``python -m service_kit.auth new NAME [ROLE] [MAX_PRIORITY]`` makes a token and prints its line.
Without a token file every caller is the anonymous admin: the services behave as on a trusted loopback.
"""
from __future__ import annotations

import contextvars
import hashlib
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from service_kit.errors import PermissionDenied, Unauthenticated

ROLES = ("user", "admin")
INT32_MAX = 2**31 - 1
IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Methods any caller may use without a token: probes and tooling must work before credentials exist.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")


@dataclass(frozen=True)
class Caller:
    identity: str
    role: str = "user"
    max_priority: int = INT32_MAX

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_act_on(self, owner: str) -> bool:
        """Owners act on their own resources; admins on everyone's."""
        return self.is_admin or owner == self.identity

    def check_priority(self, priority: int, field: str = "priority") -> None:
        if priority > self.max_priority:
            raise PermissionDenied(f"{field} {priority} is above the ceiling of {self.identity!r} "
                                   f"({self.max_priority}); ask the operator for a higher one",
                                   reason="PRIORITY_ABOVE_CEILING",
                                   metadata={"identity": self.identity, "max_priority": str(self.max_priority)})


# Without authentication everyone is this caller: the trusted-loopback behaviour.
ANONYMOUS = Caller("anonymous", "admin", INT32_MAX)
_current: contextvars.ContextVar[Caller] = contextvars.ContextVar("caller", default=ANONYMOUS)


def current_caller() -> Caller:
    """The caller of the RPC this task serves (set by the edge interceptor)."""
    return _current.get()


def set_caller(caller: Caller) -> contextvars.Token:
    return _current.set(caller)


class TokenFileError(ValueError):
    pass


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenBook:
    """Token digests to callers."""

    by_digest: dict[str, Caller]

    @classmethod
    def load(cls, path: Path) -> "TokenBook":
        by_digest: dict[str, Caller] = {}
        seen: set[str] = set()
        for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 4:
                raise TokenFileError(f"{path}:{n}: want 'identity role max_priority sha256', got {len(parts)} fields")
            identity, role, ceiling, hexdigest = parts
            if not IDENTITY.fullmatch(identity):
                raise TokenFileError(f"{path}:{n}: identity must be 1-64 letters, digits, '.', '_' or '-'")
            if role not in ROLES:
                raise TokenFileError(f"{path}:{n}: role must be one of {', '.join(ROLES)}, got {role!r}")
            if not re.fullmatch(r"-?\d+", ceiling) or not -2**31 <= int(ceiling) <= INT32_MAX:
                raise TokenFileError(f"{path}:{n}: max_priority must be a 32-bit integer, got {ceiling!r}")
            if not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
                raise TokenFileError(f"{path}:{n}: the last field is the token's sha256 in lowercase hex")
            if identity in seen or hexdigest in by_digest:
                raise TokenFileError(f"{path}:{n}: identity or token listed twice")
            seen.add(identity)
            by_digest[hexdigest] = Caller(identity, role, int(ceiling))
        if not by_digest:
            raise TokenFileError(f"{path} names no tokens")
        return cls(by_digest)

    def authenticate(self, metadata) -> Caller:
        """The caller whose bearer token is in `metadata` (gRPC invocation metadata)."""
        values = [v for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            raise Unauthenticated("this server wants a bearer token: send metadata 'authorization: Bearer <token>'",
                                  reason="MISSING_TOKEN")
        scheme, _, token = (values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization metadata must read 'Bearer <token>'", reason="BAD_TOKEN")
        caller = self.by_digest.get(digest(token.strip()))
        if caller is None:
            raise Unauthenticated("this token is not known to the server", reason="BAD_TOKEN")
        return caller


def bound_client_id(caller: Caller, client_id: str) -> None:
    """A broker client_id names the authenticated identity, or one of its instances ('<identity>/<suffix>')."""
    if caller is ANONYMOUS or caller.is_admin:
        return
    if client_id != caller.identity and not client_id.startswith(caller.identity + "/"):
        raise PermissionDenied(f"client_id must be {caller.identity!r} or start with '{caller.identity}/' "
                               "(it is bound to the token's identity)", reason="CLIENT_ID_NOT_BOUND",
                               metadata={"identity": caller.identity})


def read_token_file(path: Path) -> str:
    """A service's own token, for the calls it makes to another service (e.g. the broker)."""
    token = Path(path).read_text().strip()
    if not token or any(ch.isspace() for ch in token):
        raise TokenFileError(f"{path} must hold one token and nothing else")
    return token


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "new" or len(argv) > 4:
        print("usage: python -m service_kit.auth new IDENTITY [ROLE] [MAX_PRIORITY]", file=sys.stderr)
        return 2
    identity, role = argv[1], argv[2] if len(argv) > 2 else "user"
    ceiling = argv[3] if len(argv) > 3 else str(INT32_MAX if role == "admin" else 100)
    if not IDENTITY.fullmatch(identity) or role not in ROLES or not re.fullmatch(r"-?\d+", ceiling):
        print(f"identity: 1-64 letters, digits, '.', '_' or '-'; role: {' or '.join(ROLES)}; max_priority: an "
              "integer", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(32)
    print(f"token (give it to {identity}; it is not stored anywhere): {token}", file=sys.stderr)
    print(f"{identity} {role} {ceiling} {digest(token)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
