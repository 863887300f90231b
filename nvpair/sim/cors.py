# -*- test-case-name: tests.sim.test_sim -*-
"""Each engine's CORS behaviour (docs/browser-policy.md#each-engines-own-policy), as pure policies.

A policy looks at a call before routing and either answers it outright (a preflight, or Ollama's
403 for a foreign origin) or names the headers to add to whatever the route answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

import attrs

from nvpair.sim.wire import Call, Reply, empty_reply

ALLOW_ORIGIN = "Access-Control-Allow-Origin"
ALLOW_METHODS = "Access-Control-Allow-Methods"
ALLOW_HEADERS = "Access-Control-Allow-Headers"
ALLOW_CREDENTIALS = "Access-Control-Allow-Credentials"
MAX_AGE = "Access-Control-Max-Age"


@attrs.frozen
class CorsOutcome:
    """What a policy decided for one call.

    :param answer: a reply that replaces routing altogether, or ``None`` to route the call.
    :param headers: headers to add to the routed reply.
    """

    answer: Reply | None = None
    headers: tuple[tuple[str, str], ...] = ()


PASS = CorsOutcome()


class CorsPolicy(Protocol):
    """Decides CORS for one call."""

    def decide(self, call: Call) -> CorsOutcome: ...


# envconfig.AllowedOrigins: always allowed, whatever OLLAMA_ORIGINS says.
OLLAMA_ALWAYS_ALLOWED: tuple[str, ...] = (
    *(
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0")
        for scheme in ("http", "https")
        for port in ("", ":*")
    ),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)

# gin-contrib/cors DefaultConfig methods, and the request headers Ollama's server.go allows;
# gin writes both comma-joined, header names canonicalised.
OLLAMA_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
OLLAMA_HEADERS = ",".join(
    (
        "Authorization",
        "Content-Type",
        "User-Agent",
        "Accept",
        "X-Requested-With",
        "Openai-Beta",
        *(
            f"X-Stainless-{part}"
            for part in (
                "Arch",
                "Async",
                "Custom-Poll-Interval",
                "Helper-Method",
                "Lang",
                "Os",
                "Package-Version",
                "Poll-Helper",
                "Retry-Count",
                "Runtime",
                "Runtime-Version",
                "Timeout",
            )
        ),
    )
)
_OLLAMA_MAX_AGE = "43200"  # gin-contrib/cors default MaxAge, 12 h


def _matches(pattern: str, origin: str) -> bool:
    """gin-contrib/cors origin matching: exact, or one ``*`` standing for any run of characters."""
    pattern, origin = pattern.lower(), origin.lower()
    if "*" not in pattern:
        return pattern == origin
    prefix, _, suffix = pattern.partition("*")
    return (
        len(origin) >= len(prefix) + len(suffix)
        and origin.startswith(prefix)
        and origin.endswith(suffix)
    )


@attrs.frozen
class OllamaCors:
    """Ollama: ``OLLAMA_ORIGINS`` (``extra``) plus the always-allowed local origins.

    No ``Origin``, or an ``Origin`` equal to ``http(s)://`` + ``Host``, is not CORS. A foreign
    origin gets **403 with an empty body** on any request; an allowed ``OPTIONS`` is a 204
    preflight; any other allowed request gets ``Access-Control-Allow-Origin`` (``*`` when
    ``extra`` has ``*``).
    """

    extra: tuple[str, ...] = ()

    @property
    def origins(self) -> tuple[str, ...]:
        return (*self.extra, *OLLAMA_ALWAYS_ALLOWED)

    def decide(self, call: Call) -> CorsOutcome:
        origin = call.header("origin")
        if not origin:
            return PASS
        host = call.header("host") or ""
        if origin in (f"http://{host}", f"https://{host}"):
            return PASS
        allow_all = "*" in self.origins
        if not allow_all and not any(_matches(p, origin) for p in self.origins):
            return CorsOutcome(answer=empty_reply(403))
        allow = [(ALLOW_ORIGIN, "*")] if allow_all else [(ALLOW_ORIGIN, origin), ("Vary", "Origin")]
        if call.method == "OPTIONS":
            vary = (
                []
                if allow_all
                else [
                    ("Vary", "Access-Control-Request-Method"),
                    ("Vary", "Access-Control-Request-Headers"),
                ]
            )
            preflight = [
                (ALLOW_METHODS, OLLAMA_METHODS),
                (ALLOW_HEADERS, OLLAMA_HEADERS),
                (MAX_AGE, _OLLAMA_MAX_AGE),
                *allow,
                *vary,
            ]
            return CorsOutcome(answer=empty_reply(204, preflight))
        return CorsOutcome(headers=tuple(allow))


@attrs.frozen
class LMStudioCors:
    """LM Studio: off by default, so nothing is added and ``OPTIONS`` falls through to the
    "Unexpected endpoint" handler. With "Enable CORS" (Express ``cors()`` defaults) every
    response gets ``Access-Control-Allow-Origin: *`` and any ``OPTIONS`` is a 204 preflight that
    reflects the requested headers."""

    enabled: bool = False

    def decide(self, call: Call) -> CorsOutcome:
        if not self.enabled:
            return PASS
        allow = (ALLOW_ORIGIN, "*")
        if call.method != "OPTIONS":
            return CorsOutcome(headers=(allow,))
        headers = [allow, (ALLOW_METHODS, "GET,HEAD,PUT,PATCH,POST,DELETE")]
        headers.append(("Vary", "Access-Control-Request-Headers"))
        requested = call.header("access-control-request-headers")
        if requested:
            headers.append((ALLOW_HEADERS, requested))
        return CorsOutcome(answer=empty_reply(204, headers))


_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@attrs.frozen
class LlamaCppCors:
    """llama.cpp: ``--cors-origins`` (default ``*``). With ``*`` the ``Origin`` is reflected on
    every response (an empty value when there is none); with a list, only listed origins are
    reflected (the entry ``localhost`` standing for any loopback origin) and others simply get no
    header — never a 403. ``OPTIONS`` is answered before routing: 200, empty ``text/html``."""

    origins: tuple[str, ...] = ("*",)

    def _allows(self, origin: str | None) -> bool:
        if "*" in self.origins:
            return True
        if not origin:
            return False
        if "localhost" in self.origins and (urlsplit(origin).hostname or "") in _LOCAL_HOSTS:
            return True
        return origin in self.origins

    def decide(self, call: Call) -> CorsOutcome:
        origin = call.header("origin")
        allow = [(ALLOW_ORIGIN, origin or "")] if self._allows(origin) else []
        if call.method != "OPTIONS":
            return CorsOutcome(headers=tuple(allow))
        headers = [
            *allow,
            (ALLOW_CREDENTIALS, "true"),
            (ALLOW_METHODS, "GET, POST, DELETE, OPTIONS"),
            (ALLOW_HEADERS, "*"),
        ]
        return CorsOutcome(answer=Reply(200, (), "text/html", tuple(headers)))


def parse_origins(setting: str | Sequence[str]) -> tuple[str, ...]:
    """An origin list as typed (comma-separated, like ``OLLAMA_ORIGINS`` or ``--cors-origins``)
    or as a list."""
    items = setting.split(",") if isinstance(setting, str) else list(setting)
    return tuple(item.strip() for item in items if item.strip())
