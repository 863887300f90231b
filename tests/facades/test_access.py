"""The access line of a finished request: fields when known, never a query
(docs/README.md#the-access-log)."""

from __future__ import annotations

from nvpair.common.reasons import Reason
from nvpair.engines.table import RouteClass
from nvpair.facades.access import MAX_PATH, Finished, refused


def test_only_what_is_known_is_a_field() -> None:
    line = Finished(engine="ollama", method="GET", path="/api/tags", status=200, attempts=0)
    assert line.fields() == {
        "engine": "ollama",
        "method": "GET",
        "path": "/api/tags",
        "status": 200,
        "attempts": 0,
    }
    assert line.template() == "{method} {path} {status}"


def test_a_request_gone_before_its_answer_has_no_status() -> None:
    line = Finished(engine="ollama", method="POST", path="/api/chat", outcome="cancelled")
    assert line.template() == "{method} {path}" and "status" not in line.fields()


def test_a_refusal_has_its_reasons_status_and_no_query() -> None:
    line = refused("ollama", b"POST", "/api/chat?token=secret", Reason.BODY_TOO_LARGE)
    assert (line.status, line.outcome, line.path, line.route) == (
        413,
        "body-too-large",
        "/api/chat",
        None,
    )
    assert (
        refused("ollama", b"POST", "/x", Reason.BAD_JSON, RouteClass.INFERENCE).route == "inference"
    )


def test_bytes_that_are_no_request() -> None:
    line = refused("llamacpp", b"", None, Reason.BAD_REQUEST)
    assert line.fields() == {
        "engine": "llamacpp",
        "facade": "llamacpp",
        "status": 400,
        "outcome": "bad-request",
    }
    assert line.template() == "unreadable request: {status}"


def test_a_long_path_is_cut() -> None:
    line = refused("ollama", b"GET", "/" + "a" * 10_000, Reason.FORBIDDEN)
    assert line.path is not None and len(line.path) == MAX_PATH + 3


def test_a_refusal_names_its_facade_and_who_knocked() -> None:
    """docs/README.md#the-access-log: ``client`` is the source address, ``facade`` the facade
    the request came through, refusals at the head included; an IPv4 caller reads as IPv4
    whatever the listener saw."""
    line = refused("openai", b"GET", "/v1/models", Reason.UNAUTHORIZED, client="::ffff:192.168.1.7")
    assert (line.fields()["client"], line.fields()["facade"]) == ("192.168.1.7", "openai")
