"""The request guard: which hosts the server answers to, which requests may change state, and
how large and how slow a request body may be.

A pure ASGI middleware (no body buffering beyond the JSON cap), in front of everything:

- Host allow-list: a request whose `Host` is not an allowed name is refused (400). This stops
  DNS rebinding: a web page on `evil.example` that re-points its name to 127.0.0.1 still sends
  `Host: evil.example`.
- Cross-site writes: POST/PUT/PATCH/DELETE must carry a JSON body, the custom header
  `X-Accuracy-Request`, or an API token header. A browser sends none of these cross-site
  without a CORS preflight, which this server never grants. A request whose `Origin` names a
  host that is not allowed is refused (403) whatever it carries.
- Request line and Host: a request with more than one `Host` header, or whose target is not a
  path (absolute form `GET http://evil/api/...`, which proxies use) is refused (400): the two
  could name different hosts, and which one a check reads would decide what it allows.
- Bodies: every body but an upload is capped (`max_json_bytes`, by Content-Length and by the
  bytes actually received); every body, uploads included, must keep arriving: a read that waits
  longer than `read_timeout_s` ends the request with 408.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_BINDS = {"", "0.0.0.0", "::", "[::]", "*"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}
REQUEST_HEADER = "x-accuracy-request"
DEFAULT_MAX_JSON_BYTES = 1024 * 1024
DEFAULT_READ_TIMEOUT_S = 60.0
# Where GuardedHttpTools keeps the request target as it came on the request line (uvicorn's
# httptools parser keeps only its path in `path`/`raw_path`).
TARGET_KEY = "accuracy.request_target"


def http_protocol() -> Any:
    """The uvicorn HTTP protocol to serve with: uvicorn's own, keeping the raw request target
    in the scope so the guard can refuse an absolute-form target (h11 keeps it in raw_path)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: h11's raw_path is the target as sent
        return "h11"

    class GuardedHttpTools(HttpToolsProtocol):
        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self.scope[TARGET_KEY] = self.url  # type: ignore[literal-required]

    return GuardedHttpTools


def request_line_refusal(scope: Scope) -> str | None:
    """Why the request line or Host header is refused (duplicate Host, non-path target)."""
    if sum(1 for k, _ in scope.get("headers", ()) if k.lower() == b"host") > 1:
        return "more than one Host header; send exactly one"
    target = scope.get(TARGET_KEY) or scope.get("raw_path") or b"/"
    if not target.startswith(b"/") and not (target == b"*" and scope["method"] == "OPTIONS"):
        return "the request target must be a path (/...), not an absolute URL"
    return None


def normalise_host(name: str) -> str:
    """A host name as it appears in a Host header without its port: lower case, IPv6 in []."""
    name = name.strip().lower().rstrip(".")
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"  # a bare IPv6 literal
    return name


def host_of(header: str) -> str:
    """The host part of a Host header value ('[::1]:8000' -> '[::1]', 'a.b:80' -> 'a.b')."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[:end + 1] if end > 0 else ""
    return header.rsplit(":", 1)[0] if ":" in header else header.rstrip(".")


def allowed_hosts_for(bind_host: str | None, extra: Iterable[str] = ()) -> list[str]:
    """Loopback names, the address the server binds to (unless a wildcard), and `extra`."""
    names = list(LOOPBACK_HOSTS)
    if bind_host and bind_host.strip() not in WILDCARD_BINDS:
        names.append(normalise_host(bind_host))
    for item in extra:
        names.extend(normalise_host(n) for n in str(item).split(",") if n.strip())
    return list(dict.fromkeys(names))


class HostPolicy:
    """Matches host names against the allow-list: exact names, '*.domain' or '*' (any)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        names = [normalise_host(n) for n in allowed]
        self.any = "*" in names
        self.exact = {n for n in names if not n.startswith("*")}
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host: str) -> bool:
        if not host:
            return False
        return self.any or host in self.exact or (bool(self.suffixes)
                                                 and host.endswith(self.suffixes))


def _is_json(headers: Headers) -> bool:
    ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return ctype == "application/json"


class BodyTooLarge(HTTPException):
    def __init__(self, cap: int) -> None:
        super().__init__(413, f"request body is larger than this server's limit of {cap} bytes "
                              "for this endpoint", headers={"Connection": "close"})


class BodyStalled(HTTPException):
    def __init__(self, timeout: float) -> None:
        super().__init__(408, f"the request body stopped arriving (nothing for {timeout:g} s); "
                              "request dropped", headers={"Connection": "close"})


class RequestGuard:
    """See the module docstring. `upload_paths` are (method, path) pairs whose bodies are files
    (capped by the upload limit in uploads.py, not by max_json_bytes)."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, allowed_hosts: Iterable[str],
                 max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                 upload_paths: Iterable[tuple[str, str]] = (("POST", "/api/runs"),)) -> None:
        self.app = app
        self.hosts = HostPolicy(allowed_hosts)
        self.max_json_bytes = int(max_json_bytes)
        self.read_timeout_s = float(read_timeout_s)
        self.upload_paths = {(m.upper(), p.rstrip("/")) for m, p in upload_paths}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = request_line_refusal(scope)
        if refusal:
            log.warning("refused a request: %s", refusal)
            await _reply(send, 400, refusal)
            return
        headers = Headers(scope=scope)
        host = host_of(headers.get("host", ""))
        if not self.hosts.allows(host):
            log.warning("refused a request for host %r (not in the allowed hosts)", host[:100])
            await _reply(send, 400, "this server does not answer to that Host name; its "
                                    "operator can add it with --allowed-hosts")
            return
        method = scope["method"].upper()
        if method not in SAFE_METHODS:
            refusal = self._write_refusal(headers)
            if refusal:
                await _reply(send, 403, refusal)
                return
        is_upload = (method, scope["path"].rstrip("/")) in self.upload_paths
        cap = None if is_upload else self.max_json_bytes
        if cap is not None:
            try:
                length = int(headers.get("content-length", "0") or 0)
            except ValueError:
                await _reply(send, 400, "invalid Content-Length")
                return
            if length > cap:
                await _reply(send, 413, BodyTooLarge(cap).detail)
                return
        await self.app(scope, self._receive(receive, cap), send)

    def _write_refusal(self, headers: Headers) -> str | None:
        """Why a state-changing request is refused as possibly cross-site, or None."""
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if origin == "null" or not parts.hostname or not self.hosts.allows(
                    normalise_host(parts.hostname)):
                return ("cross-site request refused: its Origin is not one of this server's "
                        "allowed hosts")
        if (_is_json(headers) or headers.get(REQUEST_HEADER) or headers.get("authorization")
                or headers.get("x-accuracy-token")):
            return None
        return ("state-changing requests need a JSON body or the header "
                "'X-Accuracy-Request: 1' (this keeps other web sites from sending them)")

    def _receive(self, receive: Receive, cap: int | None) -> Receive:
        """receive() with a read timeout while the body arrives, counting it against cap."""
        state = {"received": 0, "done": False}
        timeout = self.read_timeout_s

        async def guarded() -> Message:
            if state["done"]:
                return await receive()  # e.g. a streaming response listening for disconnect
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise BodyStalled(timeout) from None
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if cap is not None and state["received"] > cap:
                    raise BodyTooLarge(cap)
                if not message.get("more_body", False):
                    state["done"] = True
            else:
                state["done"] = True
            return message

        return guarded


async def _reply(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
