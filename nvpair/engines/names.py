"""Ollama model names: parse them, derive the key the proxy matches on, and the display form.

The rules are Ollama's own (``types/model/name.go``: ``ParseNameBare``, ``IsValid``,
``EqualFold``, ``DisplayShortest``), so that the proxy finds an owner for exactly the names an
Ollama server would accept and treats as one model. Source suffixes (``:cloud``/``:local``)
are not handled here.
"""

from __future__ import annotations

import re

import attrs

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TAG",
    "OllamaName",
    "ollama_display",
    "ollama_key",
    "parse_ollama_name",
]

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Spelled out as ASCII classes on purpose: Ollama validates byte by byte, so "é" or a
# full-width digit must be refused, which \w would not do.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")  # no ".": Ollama forbids it here
_MODEL_OR_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

_MAX_HOST = 350
_MAX_PART = 80


def _valid(pattern: re.Pattern[str], limit: int, part: str) -> bool:
    # The length is checked first so a huge input costs no regex work; the pattern excludes
    # "" so an empty part (from "m:", "/m", "h//m") is invalid here too.
    return len(part) <= limit and pattern.fullmatch(part) is not None


@attrs.frozen
class OllamaName:
    """
    A valid Ollama model name with Ollama's defaults filled in.

    The parts keep the case they were written in (Ollama stores and displays them that way);
    comparisons go through :meth:`key`, which folds case. A ``scheme://`` prefix on the host
    is not kept: Ollama uses it only to pick how to reach a registry, never to tell models
    apart.
    """

    host: str
    namespace: str
    model: str
    tag: str

    def key(self) -> str:
        """The case-insensitive comparison key, ``host/namespace/model:tag`` lowercased."""
        # Every valid character is ASCII, so str.lower() is exactly Go's strings.EqualFold.
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}".lower()

    def display(self) -> str:
        """The shortest form Ollama shows (``DisplayShortest``); the tag is always included."""
        if self.host.lower() != DEFAULT_HOST:
            # A non-default host needs its namespace too, or the name would re-parse as
            # namespace/model.
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def parse_ollama_name(text: str) -> OllamaName | None:
    """
    Parse ``[host/][namespace/]model[:tag]`` the way Ollama does.

    A tag exists only when the last ``:`` comes after the last ``/`` (``host:5000/ns/m`` has
    no tag). Splitting from the right on ``/``: one part is the model, two are
    ``namespace/model`` (never host), three are ``host/namespace/model``; more leave a ``/``
    in the host, which makes it invalid. A ``scheme://`` prefix on the host is dropped.

    :param text: the name as a client or an engine wrote it.
    :return: the name with defaults (``registry.ollama.ai``, ``library``, ``latest``) merged
        in, or ``None`` if Ollama would reject it: an empty part (``""``, ``llama3:``,
        ``ns/``, ``/m``), a character outside the grammar (``m@d``, ``@t``, spaces, non-ASCII),
        or a part over its length limit (host 350, others 80).
    """
    rest, tag = text, DEFAULT_TAG
    if text.rfind(":") > text.rfind("/"):
        rest, _, tag = text.rpartition(":")

    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    pieces = rest.rsplit("/", 2)
    if len(pieces) == 1:
        (model,) = pieces
    elif len(pieces) == 2:
        namespace, model = pieces
    else:
        host, namespace, model = pieces
        # Ollama cuts at the first "://" and keeps whatever follows as the host, unvalidated
        # scheme and all; doing the same keeps us accepting exactly what it accepts.
        _scheme, sep, after = host.partition("://")
        if sep:
            host = after

    if not (
        _valid(_HOST, _MAX_HOST, host)
        and _valid(_NAMESPACE, _MAX_PART, namespace)
        and _valid(_MODEL_OR_TAG, _MAX_PART, model)
        and _valid(_MODEL_OR_TAG, _MAX_PART, tag)
    ):
        return None
    return OllamaName(host=host, namespace=namespace, model=model, tag=tag)


def ollama_key(text: str) -> str:
    """
    The key under which two Ollama names are the same model.

    ``llama3``, ``Llama3:latest``, ``library/llama3`` and
    ``registry.ollama.ai/library/llama3:latest`` all give
    ``registry.ollama.ai/library/llama3:latest``.

    An invalid name is returned unchanged: it is matched exactly and so finds no owner (502
    ``no-owner``, docs/candidate-order.md#owners), and Ollama itself would refuse it with a
    400: normalizing it would invent a model the engine does not recognise. Returning it
    as-is cannot collide with a real model either: every key of a valid name is itself a valid
    name, so no invalid text equals one.

    :param text: the name as written.
    :return: the comparison key, or *text* itself if it is not a valid name.
    """
    name = parse_ollama_name(text)
    return text if name is None else name.key()


def ollama_display(text: str) -> str:
    """
    The form Ollama shows a name in (events, merged model lists).

    Host and namespace are omitted when both are the defaults (``llama3:latest``), a
    non-default namespace is kept (``user/m:tag``), both are kept when the host is not the
    default (``host:5000/library/m:latest``), and the tag is always shown. Case is preserved.

    :param text: the name as written.
    :return: the display form, or *text* itself if it is not a valid name (for the same
        reason as :func:`ollama_key`).
    """
    name = parse_ollama_name(text)
    return text if name is None else name.display()
