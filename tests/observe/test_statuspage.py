# -*- test-case-name: tests.observe.test_statuspage -*-
"""The status page as a document (:mod:`nvpair.observe.statuspage`,
docs/operations.md#the-status-page): self-contained, data only ever inserted as text, and a policy
that allows exactly its own inline style and script. How it renders is
tests/integration/test_status_page.py's."""

from __future__ import annotations

import base64
import hashlib
import re

from nvpair.observe.statuspage import CONTENT_SECURITY_POLICY, PAGE

TEXT = PAGE.decode()


def inline(tag: str) -> str:
    (body,) = re.findall(rf"<{tag}>(.*?)</{tag}>", TEXT, flags=re.DOTALL)
    return str(body)


def digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in CONTENT_SECURITY_POLICY.decode().split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def test_the_policy_allows_only_the_pages_own_style_and_script_and_its_origin() -> None:
    """``default-src 'none'``; the inline style and script by hash (no ``'unsafe-inline'``, so
    an injected element would not run); ``fetch`` to the page's own origin only."""
    policy = directives()
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == [digest(inline("script"))]
    assert policy["style-src"] == [digest(inline("style"))]
    assert policy["connect-src"] == ["'self'"]
    assert policy["base-uri"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert b"unsafe" not in CONTENT_SECURITY_POLICY


def test_the_page_loads_nothing_else() -> None:
    """One document: no external script, stylesheet, image, font or import."""
    assert TEXT.count("<script") == 1 and TEXT.count("<style") == 1
    for reference in ("src=", "href=", "url(", "@import", "import(", "http:", "https:"):
        assert reference not in TEXT, reference


def test_data_never_enters_the_dom_as_markup() -> None:
    """Node ids come from a fleet file and model names from engines: the script builds
    elements and sets ``textContent``; no API that parses a string as HTML or code."""
    script = inline("script")
    for parser in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "Function(",
        "setAttribute",
    ):
        assert parser not in script, parser
    assert "textContent" in script and 'fetch("/status"' in script
