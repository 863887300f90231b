"""Text log lines: time, level, message, fields, and no value that can forge a line or a field
(docs/README.md#logging)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from nvpair.common.logtext import field_value, message, named_fields, text_line

LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (debug|info |warn |error) ")

_UNESCAPE = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _unquoted(text: str) -> str:
    """A quoted value read back: the inverse of the escaping."""
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        kind = text[index + 1]
        if kind in _UNESCAPE:
            out.append(_UNESCAPE[kind])
            index += 2
        else:
            width = {"x": 2, "u": 4, "U": 8}[kind]
            out.append(chr(int(text[index + 2 : index + 2 + width], 16)))
            index += 2 + width
    return "".join(out)


def read_fields(tail: str) -> list[tuple[str, str]]:
    """A logfmt reader: ``key=value`` or ``key="quoted \\" value"``, separated by spaces."""
    found = re.findall(r' ([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|[^ "]+)', tail)
    assert "".join(f" {k}={v}" for k, v in found) == tail, f"unparsed text in {tail!r}"
    return [(k, _unquoted(v[1:-1]) if v.startswith('"') else v) for k, v in found]


def test_a_line_is_time_level_message_then_fields() -> None:
    line = text_line(0.5, "info", "node-a joined", [("engine", "ollama"), ("count", 2)])
    assert LINE.match(line)
    assert line.endswith(" info  node-a joined engine=ollama count=2\n")


def test_unknown_values_and_unnamed_keys_are_left_out() -> None:
    line = text_line(0, "warn", "m", [("node", None), ("bad key", "x"), ("ok", True)])
    assert line.endswith(" warn  m ok=true\n")


@given(st.text())
def test_no_field_value_can_forge_a_line_or_a_field(value: str) -> None:
    """Whatever a value holds (newlines, quotes, ``=``, separators), the line stays one line and
    reads back as exactly the fields written, the value intact."""
    line = text_line(0, "info", "m", [("a", value), ("b", "x")])
    assert line.count("\n") == 1 and line.endswith("\n")
    assert "\u2028" not in line and "\u2029" not in line and "\r" not in line
    tail = line[LINE.match(line).end() + 1 : -1]  # type: ignore[union-attr]
    assert read_fields(tail) == [("a", value), ("b", "x")]


@given(st.text())
def test_no_value_in_a_message_can_forge_a_line_or_a_field(value: str) -> None:
    """A value substituted into the message holds no bare ``=`` nor a line break."""
    text = message("failed: {why}", {"why": value})
    assert text is not None and text.isprintable()
    rest = text.removeprefix("failed: ")
    if "=" in value or '"' in value or "\\" in value or not value.isprintable():
        assert rest.startswith('"') and rest.endswith('"') and _unquoted(rest[1:-1]) == value
    else:
        assert rest == value


def test_quoting_rules() -> None:
    assert field_value("node-a") == "node-a"
    assert field_value("two words") == '"two words"'
    assert field_value("") == '""'
    assert field_value('a="b"') == '"a=\\"b\\""'
    assert field_value("x\ny") == '"x\\ny"'
    assert field_value(False) == "false" and field_value(1.5) == "1.5"
    # Spaces are prose in a message; the rest is quoted there too.
    assert message("{a} | {b}", {"a": "in use", "b": "k=v"}) == 'in use | "k=v"'


def test_the_fields_a_template_names() -> None:
    assert named_fields("{node} on {port!r}: {failure.value} {x[0]}") == {
        "node",
        "port",
        "failure",
        "x",
    }
    assert named_fields("unbalanced {") == frozenset()


def test_a_template_that_does_not_format_says_so() -> None:
    assert message("{missing}", {}) is None


def test_a_traceback_follows_under_its_record() -> None:
    line = text_line(0, "error", "it broke", [], stack='Traceback:\n  File "x"\nBoom\r\x1b[2J\n')
    first, *rest = line.rstrip("\n").split("\n")
    assert LINE.match(first)
    assert rest == ["  | Traceback:", '  |   File "x"', "  | Boom\\r\\x1b[2J"]
