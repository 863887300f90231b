"""The proxy's own answers: the ``Reason`` enum is the table the docs publish
(docs/request-path.md#proxy-generated-answers), row for row and status for status."""

from __future__ import annotations

import re
from pathlib import Path

from nvpair.common.reasons import Reason
from nvpair.facades.answers import reason_phrase

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: One row of the table: `reason` | status (perhaps "+ `Retry-After`") | when.
_ROW = re.compile(r"\| `([a-z-]+)` \| (\d{3})( \+ `Retry-After`)? \| [^|]+ \|")


def documented() -> dict[str, tuple[int, bool]]:
    """reason → (status, whether the row says Retry-After), read from the docs' table."""
    text = (DOCS / "request-path.md").read_text()
    section = text.split("\n## Proxy-generated answers\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[int, bool]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        row = _ROW.fullmatch(line)
        assert row is not None, f"a row the test cannot read: {line}"
        assert row[1] not in rows, f"{row[1]} documented twice"
        rows[row[1]] = (int(row[2]), row[3] is not None)
    return rows


def test_the_enum_is_the_documented_table() -> None:
    table = documented()
    assert sorted(table) == sorted(reason.value for reason in Reason)
    assert {reason.value: reason.status for reason in Reason} == {
        name: status for name, (status, _) in table.items()
    }


def test_every_503_and_429_and_only_those_are_documented_with_retry_after() -> None:
    """The loop's own give-ups answer 503 with the pending backoff, and the failed-key
    throttle 429 with its wait (docs/request-path.md#proxy-generated-answers)."""
    assert all((status in (503, 429)) == retry for status, retry in documented().values())


def test_each_reason_is_a_header_token_with_a_status_and_a_message() -> None:
    """``X-Nvpair-Error`` carries the value as it is, written as ASCII at the request head."""
    for reason in Reason:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", reason.value)
        assert str(reason) == f"{reason}" == reason.value
        assert reason.status >= 400 and reason_phrase(reason.status) != b"Error"
        assert reason.message and reason.message.isascii()
