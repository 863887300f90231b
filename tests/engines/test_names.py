"""Tests for nvpair.engines.names: Ollama model names (docs/candidate-order.md#owners)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.engines.names import OllamaName, ollama_display, ollama_key, parse_ollama_name

LLAMA3_KEY = "registry.ollama.ai/library/llama3:latest"


@pytest.mark.parametrize(
    "text",
    [
        "llama3",
        "Llama3:latest",
        "library/llama3",
        "registry.ollama.ai/library/llama3:latest",
        "LLAMA3",
        "llama3:LATEST",
        "Library/Llama3:Latest",
        "REGISTRY.OLLAMA.AI/LIBRARY/LLAMA3:LATEST",
        "https://registry.ollama.ai/library/llama3",
        "http://registry.ollama.ai/library/llama3:latest",
    ],
)
def test_spellings_of_one_model_share_a_key(text: str) -> None:
    """The documented example: these all name one model (defaults filled, case folded)."""
    assert ollama_key(text) == LLAMA3_KEY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("llama3", OllamaName("registry.ollama.ai", "library", "llama3", "latest")),
        ("Llama3:8B", OllamaName("registry.ollama.ai", "library", "Llama3", "8B")),
        ("user/m:tag", OllamaName("registry.ollama.ai", "user", "m", "tag")),
        ("user/m", OllamaName("registry.ollama.ai", "user", "m", "latest")),
        ("host:5000/ns/m", OllamaName("host:5000", "ns", "m", "latest")),
        ("host:5000/ns/m:q4", OllamaName("host:5000", "ns", "m", "q4")),
        ("example.com/library/m", OllamaName("example.com", "library", "m", "latest")),
        ("https://example.com/ns/m:t", OllamaName("example.com", "ns", "m", "t")),
        ("http://host:5000/ns/m", OllamaName("host:5000", "ns", "m", "latest")),
        (
            "qwen2.5-coder:7b-instruct-q4_K_M",
            OllamaName("registry.ollama.ai", "library", "qwen2.5-coder", "7b-instruct-q4_K_M"),
        ),
        ("_m:_t", OllamaName("registry.ollama.ai", "library", "_m", "_t")),
        ("9b:1.5", OllamaName("registry.ollama.ai", "library", "9b", "1.5")),
        ("m..x:t..", OllamaName("registry.ollama.ai", "library", "m..x", "t..")),
        ("_host/n/m", OllamaName("_host", "n", "m", "latest")),
        ("h.:-/n/m", OllamaName("h.:-", "n", "m", "latest")),
    ],
)
def test_parse_valid(text: str, expected: OllamaName) -> None:
    """Parsing splits [host/][namespace/]model[:tag], keeps case and fills the defaults."""
    assert parse_ollama_name(text) == expected


def test_colon_before_last_slash_is_not_a_tag() -> None:
    """A tag exists only when the last ':' follows the last '/': host:5000/ns/m has no tag."""
    name = parse_ollama_name("host:5000/ns/m")
    assert name is not None
    assert (name.host, name.tag) == ("host:5000", "latest")


def test_one_slash_is_namespace_never_host() -> None:
    """One '/' means namespace/model, even when the first part looks like a host."""
    name = parse_ollama_name("example.com/m")
    # "." is not allowed in a namespace, so read as a namespace this is invalid; read as a
    # host it would have been valid. Ollama reads it as a namespace.
    assert name is None
    name = parse_ollama_name("localhost/m")
    assert name == OllamaName("registry.ollama.ai", "localhost", "m", "latest")


INVALID = [
    "",
    "llama3:",
    ":",
    ":latest",
    "m@d",
    "@t",
    "m:t@sha256-abc",
    "user/",
    "/m",
    "/",
    "h//m",
    "h/n/",
    "//m",
    "a/b/c/d",
    "a/b/c/d:t",
    "m:t:u",
    "gpt-oss:20b:cloud",  # source suffixes are out of scope, so this is model "gpt-oss:20b"
    "ns.x/m",
    "-m",
    ".m",
    "m:-t",
    "m:.t",
    "-h/n/m",
    "h/-n/m",
    "h/n.x/m",
    "m t",
    " m",
    "m ",
    "m\n",
    "m+q4",
    "m:t+q4",
    "caf\u00e9",
    "m\uff10",  # FULLWIDTH DIGIT ZERO: a digit to Python, not to Ollama
    "https://",
    "https:///n/m",
    "http://n/m",
    "m" * 81,
    "m:" + "t" * 81,
    "n" * 81 + "/m",
    "h" * 351 + "/n/m",
]


@pytest.mark.parametrize("text", INVALID, ids=[repr(t)[:40] for t in INVALID])
def test_invalid_names(text: str) -> None:
    """
    Ollama rejects these (empty part, '@', characters or lengths outside Ollama's grammar);
    the proxy does not normalize them, so key and display are the text itself.
    """
    assert parse_ollama_name(text) is None
    assert ollama_key(text) == text
    assert ollama_display(text) == text


@pytest.mark.parametrize(
    "text",
    ["m" * 80, "m:" + "t" * 80, "n" * 80 + "/m", "h" * 350 + "/n/m"],
    ids=["model-80", "tag-80", "namespace-80", "host-350"],
)
def test_length_limits_are_inclusive(text: str) -> None:
    """Parts at exactly their limit (host 350, the others 80) are valid."""
    assert parse_ollama_name(text) is not None


@pytest.mark.parametrize(
    ("text", "display"),
    [
        ("llama3", "llama3:latest"),
        ("Llama3", "Llama3:latest"),
        ("registry.ollama.ai/library/llama3:8b", "llama3:8b"),
        ("Registry.Ollama.AI/LIBRARY/llama3", "llama3:latest"),
        ("user/m:tag", "user/m:tag"),
        ("registry.ollama.ai/user/m", "user/m:latest"),
        ("host:5000/library/m", "host:5000/library/m:latest"),
        ("host/ns/m:t", "host/ns/m:t"),
        ("https://host/ns/m:t", "host/ns/m:t"),
        ("https://registry.ollama.ai/library/m", "m:latest"),
    ],
)
def test_display(text: str, display: str) -> None:
    """
    The display form omits host and namespace when both are default, keeps a non-default
    namespace, keeps both for a non-default host, always shows the tag, and keeps case.
    """
    assert ollama_display(text) == display


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("llama3", "llama3:8b"),
        ("llama3", "user/llama3"),
        ("user/llama3", "other.host/user/llama3"),
        ("llama3", "llama3.1"),
        ("llama3:", "llama3"),
        ("Llama3:", "llama3:"),
    ],
)
def test_different_models_have_different_keys(a: str, b: str) -> None:
    """Names that differ in any part (or invalid spellings, compared exactly) do not match."""
    assert ollama_key(a) != ollama_key(b)


# Strategies that build valid names from Ollama's grammar, in mixed case, with and without
# each optional part.
_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"


def _part(rest: str, max_size: int) -> st.SearchStrategy[str]:
    return st.builds(
        lambda first, tail: first + tail,
        st.sampled_from(_FIRST),
        st.text(alphabet=_FIRST + rest, max_size=max_size - 1),
    )


_hosts = st.one_of(
    st.sampled_from(["registry.ollama.ai", "REGISTRY.Ollama.AI", "localhost:11434"]),
    _part(".:-", 30),
)
_namespaces = st.one_of(st.sampled_from(["library", "Library", "user"]), _part("-", 20))
_models = _part(".-", 30)
_tags = st.one_of(st.sampled_from(["latest", "LATEST", "8b"]), _part(".-", 20))


@st.composite
def valid_names(draw: st.DrawFn) -> str:
    """A valid Ollama name in any of its written shapes."""
    model = draw(_models)
    shape = draw(st.sampled_from(["m", "n/m", "h/n/m", "s://h/n/m"]))
    if shape == "m":
        text = model
    elif shape == "n/m":
        text = f"{draw(_namespaces)}/{model}"
    else:
        text = f"{draw(_hosts)}/{draw(_namespaces)}/{model}"
        if shape == "s://h/n/m":
            text = f"{draw(st.sampled_from(['http', 'https']))}://{text}"
    if draw(st.booleans()):
        text = f"{text}:{draw(_tags)}"
    return text


@given(valid_names())
def test_generated_names_are_valid(text: str) -> None:
    """The generator used below only produces names Ollama accepts."""
    assert parse_ollama_name(text) is not None


@given(valid_names())
def test_key_of_display_is_key(text: str) -> None:
    """Showing a name and reading it back names the same model."""
    assert ollama_key(ollama_display(text)) == ollama_key(text)


@given(valid_names())
def test_key_is_idempotent(text: str) -> None:
    """A key is itself a valid name whose key is itself."""
    key = ollama_key(text)
    assert parse_ollama_name(key) is not None
    assert ollama_key(key) == key


@given(valid_names())
def test_display_is_idempotent(text: str) -> None:
    """The display form is already in display form."""
    display = ollama_display(text)
    assert ollama_display(display) == display


@given(valid_names(), st.data())
def test_key_ignores_case(text: str, data: st.DataObject) -> None:
    """Comparison is case-insensitive over all four parts."""
    flips = data.draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    recased = "".join(c.swapcase() if flip else c for c, flip in zip(text, flips, strict=True))
    assert ollama_key(recased) == ollama_key(text)


@given(st.text(alphabet=st.sampled_from("aZ9_.-:/@ \u00e9+"), max_size=12) | st.text())
def test_any_text_is_either_parsed_or_left_alone(text: str) -> None:
    """
    For arbitrary text: an invalid name's key and display are the text itself, and
    display-then-key and display-then-display are stable whether or not it is valid.
    """
    if parse_ollama_name(text) is None:
        assert ollama_key(text) == text
        assert ollama_display(text) == text
    assert ollama_key(ollama_display(text)) == ollama_key(text)
    assert ollama_display(ollama_display(text)) == ollama_display(text)


@given(st.text(alphabet=st.sampled_from("aZ9_.-:/@ \u00e9+"), max_size=12), valid_names())
def test_invalid_text_never_collides_with_a_valid_key(invalid: str, valid: str) -> None:
    """An invalid name, matched exactly, can never find a valid name's owner."""
    if parse_ollama_name(invalid) is None:
        assert ollama_key(invalid) != ollama_key(valid)
