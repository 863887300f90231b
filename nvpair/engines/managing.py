"""Which routes of each engine change what it holds, and which name a model in their path
(docs/lan.md#what-a-key-can-and-cannot-do): the engine table's (:mod:`nvpair.engines.table`)
predicates for a LAN caller's key, each a pure function of the method and the decoded path.
"""

from __future__ import annotations

from collections.abc import Callable


def manages_nothing(method: bytes, path: str) -> bool:
    """A facade with no route that changes what an engine holds (the ``openai`` facade)."""
    return False


def no_path_model(path: str) -> str | None:
    """A facade whose routes name no model in their path."""
    return None


_OLLAMA_MANAGE = frozenset(
    {"/api/pull", "/api/push", "/api/delete", "/api/copy", "/api/create", "/api/signout", "/api/me"}
)


def ollama_manages(method: bytes, path: str) -> bool:
    # Besides the models: the account the server is signed in to (its keys, sign-out).
    return path in _OLLAMA_MANAGE or path.startswith(("/api/blobs/", "/api/user/"))


def named_after(prefix: str) -> Callable[[str], str | None]:
    """The model a path names after ``prefix`` (Ollama's ``/v1/models/<name>``)."""

    def named(path: str) -> str | None:
        rest = path[len(prefix) :] if path.startswith(prefix) else ""
        return rest or None

    return named


_LMSTUDIO_MANAGE = frozenset(
    {"/api/v1/models/load", "/api/v1/models/unload", "/api/v1/models/download"}
)


def lmstudio_manages(method: bytes, path: str) -> bool:
    # Its server may route without regard to case or a trailing slash: judged as it might.
    return path.lower().rstrip("/") in _LMSTUDIO_MANAGE


def llamacpp_manages(method: bytes, path: str) -> bool:
    # A router's /models lists on GET and adds or removes models otherwise; a slot's save,
    # restore and erase are POST /slots/<id>?action=... (GET /slots only reads); POST /props
    # and /lora-adapters change how the loaded model serves everyone.
    writes = method not in (b"GET", b"HEAD")
    return (
        path in ("/models/load", "/models/unload")
        or (writes and path in ("/models", "/props", "/lora-adapters"))
        or path.startswith("/slots/")
    )
