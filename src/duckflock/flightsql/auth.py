"""Who may call ``duckflock serve``: a bearer token given to the server, or a username and password
exchanged for a bearer token of the connection's own (Flight's "basic token" handshake, which ADBC
and JDBC clients do when given a username and password).

Every call carries ``authorization: Basic <base64 user:password>`` (answered with a new token in the
``authorization: Bearer`` response header) or ``authorization: Bearer <token>``. The token a call
carried is its caller's identity: the results and prepared statements it creates are that caller's
alone. A result's parts served by the ranks themselves (parts.py) belong to the caller's principal
instead (``Credentials.principal``): a login to a rank is a new connection, with a token of its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
import time

import pyarrow.flight as flight

ISSUED_TOKEN_LIFETIME_S = 24 * 3600.0  # a password login's token, from its last use


class Credentials:
    """What the server accepts: ``token`` and/or ``username`` with ``password``."""

    def __init__(
        self,
        token: str | None,
        username: str | None,
        password: str | None,
        signing_key: bytes | None = None,
        issued_elsewhere: bool = False,
    ):
        """A login's token is signed with ``signing_key`` (a new one when None): with
        ``issued_elsewhere`` (a rank serving its parts of a result, parts.py) a token signed with it
        is taken as the server that issued it would take it, since a client hands the token it was
        given to every location of a result (ADBC's driver does)."""
        self.token = token
        self.username = username
        self.password = password
        self.signing_key = signing_key or secrets.token_bytes(32)
        self._issued_elsewhere = issued_elsewhere
        self._issued: dict[str, float] = {}  # a password login's token -> when it was last used
        self._lock = threading.Lock()

    def caller(self, authorization: str) -> tuple[str, bool]:
        """(the caller's identity: its bearer token, whether that token is newly issued) for an
        ``authorization`` header value; FlightUnauthenticatedError for anything else."""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and self._bearer_ok(value.strip()):
            return value.strip(), False
        if scheme.lower() == "basic" and self._password_ok(value.strip()):
            nonce = secrets.token_urlsafe(32)
            token = f"{nonce}.{self._signature(nonce)}"
            with self._lock:
                self._issued[token] = time.monotonic()
            return token, True
        raise flight.FlightUnauthenticatedError(
            "duckflock serve: invalid or missing credentials (a bearer token, or username and password)"
        )

    def principal(self, identity: str) -> str:
        """Who ``identity`` (a caller's, as ``caller`` gave it) is, the same on every server holding
        these credentials: the token's holder, or the user a password login was."""
        if self.token is not None and hmac.compare_digest(identity.encode(), self.token.encode()):
            return "token"
        return f"user {self.username}"

    def _signature(self, nonce: str) -> str:
        return hmac.new(self.signing_key, nonce.encode(), hashlib.sha256).hexdigest()

    def _bearer_ok(self, given: str) -> bool:
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        if self._issued_elsewhere and self.username is not None:
            nonce, _, signature = given.partition(".")
            return hmac.compare_digest(signature.encode(), self._signature(nonce).encode())
        now = time.monotonic()
        with self._lock:
            for token, used in list(self._issued.items()):
                if now - used > ISSUED_TOKEN_LIFETIME_S:
                    del self._issued[token]
            if given in self._issued:
                self._issued[given] = now
                return True
        return False

    def _password_ok(self, value: str) -> bool:
        if self.username is None or self.password is None:
            return False
        padded = value + "=" * (-len(value) % 4)  # Go's Flight client leaves the padding out
        try:
            user, colon, password = base64.b64decode(padded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        # Both compared, whatever the first gave: the time taken tells nothing of which was wrong.
        user_ok = hmac.compare_digest(user.encode(), self.username.encode())
        password_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return bool(colon) and user_ok and password_ok


class CallerMiddleware(flight.ServerMiddleware):
    def __init__(self, identity: str, issued: bool):
        self.identity = identity
        self._issued = issued

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.identity}"} if self._issued else {}


class AuthMiddleware(flight.ServerMiddlewareFactory):
    """Checks every call's ``authorization`` header against ``credentials``."""

    def __init__(self, credentials: Credentials):
        self.credentials = credentials

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or [""]
        value = values[0].decode() if isinstance(values[0], bytes) else values[0]
        return CallerMiddleware(*self.credentials.caller(value))


class NoHandshake(flight.ServerAuthHandler):
    """Flight's Handshake call, accepted with nothing exchanged: the credentials travel in headers,
    which ``AuthMiddleware`` checks (gRPC answers a server without a handler UNIMPLEMENTED)."""

    def authenticate(self, outgoing, incoming):
        pass

    def is_valid(self, token):
        return ""
