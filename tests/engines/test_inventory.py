"""Merging fleet model lists (docs/inventories.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.engines.inventory import InvalidInventory, empty_inventory, merge_inventories
from nvpair.engines.modelnames import OtherName
from nvpair.engines.table import ENGINES, LLAMACPP, LMSTUDIO, OLLAMA, OPENAI, Engine

Entry = dict[str, object]

ROUTES: list[tuple[Engine, str]] = [
    (engine, path) for engine in ENGINES.values() for path in engine.inventory
]
ROUTE_IDS = [f"{engine.id}{path}" for engine, path in ROUTES]


def encode(document: object) -> bytes:
    return json.dumps(document).encode()


def envelope(engine: Engine, path: str, entries: Sequence[Entry] | None) -> bytes:
    """A node's body for *path*, shaped as that engine sends it."""
    route = engine.inventory[path]
    document: dict[str, object] = dict(route.empty)
    document[route.list_field] = entries
    return encode(document)


def merge(engine: Engine, path: str, *nodes: Sequence[Entry] | None) -> object:
    bodies = [envelope(engine, path, entries) for entries in nodes]
    return json.loads(merge_inventories(engine, path, bodies))


def entries_of(engine: Engine, path: str, merged: object) -> list[Entry]:
    assert isinstance(merged, dict)
    found = merged[engine.inventory[path].list_field]
    if found is None:
        return []
    assert isinstance(found, list)
    return found


def entry(engine: Engine, path: str, key: str, **fields: object) -> Entry:
    return {engine.inventory[path].key_field: key, **fields}


# -- envelopes -----------------------------------------------------------------------------

EMPTY = {
    ("ollama", "/api/tags"): b'{"models":[]}',
    ("ollama", "/api/ps"): b'{"models":[]}',
    ("ollama", "/v1/models"): b'{"object":"list","data":null}',
    ("lmstudio", "/v1/models"): b'{"object":"list","data":[]}',
    ("lmstudio", "/api/v0/models"): b'{"object":"list","data":[]}',
    ("lmstudio", "/api/v1/models"): b'{"models":[]}',
    ("llamacpp", "/models"): b'{"object":"list","data":[]}',
    ("llamacpp", "/v1/models"): b'{"object":"list","data":[]}',
}


def test_every_inventory_route_has_an_expected_empty_envelope() -> None:
    assert set(EMPTY) == {(engine.id, path) for engine, path in ROUTES}


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
def test_empty_inventory_is_the_engines_own(engine: Engine, path: str) -> None:
    assert empty_inventory(engine, path) == EMPTY[engine.id, path]


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
def test_no_entries_is_exactly_the_empty_envelope(engine: Engine, path: str) -> None:
    """No bodies, or only empty lists: byte for byte the engine's empty envelope."""
    expected = EMPTY[engine.id, path]
    assert merge_inventories(engine, path, []) == expected
    assert merge_inventories(engine, path, [envelope(engine, path, [])]) == expected
    bodies = [envelope(engine, path, []), envelope(engine, path, [])]
    assert merge_inventories(engine, path, bodies) == expected


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
def test_filled_envelope_keeps_the_engines_shape(engine: Engine, path: str) -> None:
    route = engine.inventory[path]
    merged = merge(engine, path, [entry(engine, path, "m1")], [entry(engine, path, "m2")])
    assert merged == {
        **route.empty,
        route.list_field: [entry(engine, path, "m1"), entry(engine, path, "m2")],
    }


def test_ollama_openai_list_null_is_an_empty_list() -> None:
    """Ollama marshals an empty /v1/models list as "data": null."""
    m = {"id": "llama3:latest", "object": "model", "created": 1, "owned_by": "library"}
    assert merge(OLLAMA, "/v1/models", None, [m], None) == {"object": "list", "data": [m]}
    assert merge_inventories(OLLAMA, "/v1/models", [envelope(OLLAMA, "/v1/models", None)] * 2) == (
        b'{"object":"list","data":null}'
    )


def test_each_body_can_be_read_as_its_own_engine_s_list() -> None:
    """The openai facade merges every engine's OpenAI list into its own envelope, each read as
    its node's engine writes it: Ollama's ``"data": null`` is an empty list there too, and an
    LM Studio node's null is not (docs/openai-facade.md#models)."""
    ollama, studio = OLLAMA.inventory["/v1/models"], LMSTUDIO.inventory["/v1/models"]
    null = envelope(OLLAMA, "/v1/models", None)
    a = encode({"object": "list", "data": [{"id": "a"}]})
    assert merge_inventories(OPENAI, "/v1/models", [null, a], read_as=[ollama, studio]) == (
        b'{"object":"list","data":[{"id":"a"}]}'
    )
    assert merge_inventories(OPENAI, "/v1/models", [null], read_as=[ollama]) == (
        b'{"object":"list","data":[]}'
    )
    with pytest.raises(InvalidInventory) as raised:
        merge_inventories(OPENAI, "/v1/models", [a, null], read_as=[ollama, studio])
    assert raised.value.index == 1


@pytest.mark.parametrize(
    ("engine", "path"),
    [(e, p) for e, p in ROUTES if (e.id, p) != ("ollama", "/v1/models")],
    ids=[i for i in ROUTE_IDS if i != "ollama/v1/models"],
)
def test_null_list_is_invalid_where_the_engine_never_sends_it(engine: Engine, path: str) -> None:
    with pytest.raises(InvalidInventory):
        merge_inventories(engine, path, [envelope(engine, path, None)])


def test_other_top_level_fields_are_dropped() -> None:
    """The answer is the engine's envelope; node-specific extras do not leak into it."""
    body = encode({"object": "list", "data": [{"id": "a"}], "extra": 1, "has_more": False})
    assert json.loads(merge_inventories(LMSTUDIO, "/v1/models", [body])) == {
        "object": "list",
        "data": [{"id": "a"}],
    }


def test_output_is_compact_json() -> None:
    body = encode({"models": [{"name": "a", "nested": {"x": [1, 2]}}]})
    merged = merge_inventories(OLLAMA, "/api/ps", [body])
    assert merged == b'{"models":[{"name":"a","nested":{"x":[1,2]}}]}'


# -- llama.cpp's two conventions -----------------------------------------------------------


@pytest.mark.parametrize("path", ["/models", "/v1/models"])
def test_llamacpp_merges_models_beside_data(path: str) -> None:
    """Both aliases answer llama-server's own two lists, each merged in node order, one entry
    per name, every field kept (docs/inventories.md#llamacpps-two-lists)."""
    node1 = {
        "models": [{"name": "a.gguf", "model": "a.gguf", "details": {"format": "gguf"}}],
        "object": "list",
        "data": [{"id": "a.gguf", "object": "model", "meta": {"n_ctx": 4096}}],
    }
    node2 = {
        "models": [{"name": "b.gguf", "model": "b.gguf"}, {"name": "a.gguf", "size": "n2"}],
        "object": "list",
        "data": [{"id": "b.gguf", "aliases": ["b"]}, {"id": "a.gguf", "owned_by": "n2"}],
    }
    merged = merge_inventories(LLAMACPP, path, [encode(node1), encode(node2)])
    assert merged.startswith(b'{"models":[')  # llama-server's own order of fields
    assert json.loads(merged) == {
        "models": [
            {"name": "a.gguf", "model": "a.gguf", "details": {"format": "gguf"}},
            {"name": "b.gguf", "model": "b.gguf"},
        ],
        "object": "list",
        "data": [
            {"id": "a.gguf", "object": "model", "meta": {"n_ctx": 4096}},
            {"id": "b.gguf", "aliases": ["b"]},
        ],
    }


def test_llamacpp_models_come_from_the_nodes_that_sent_them() -> None:
    """A router lists no ``models``: the others' still merge, and nodes that all sent empty
    ones answer an empty ``models``."""
    router = encode({"object": "list", "data": [{"id": "r", "status": {"value": "loaded"}}]})
    single = encode(
        {"models": [{"name": "s", "model": "s"}], "object": "list", "data": [{"id": "s"}]}
    )
    merged = json.loads(merge_inventories(LLAMACPP, "/models", [router, single]))
    assert merged["models"] == [{"name": "s", "model": "s"}]
    assert [e["id"] for e in merged["data"]] == ["r", "s"]
    empty = encode({"models": [], "object": "list", "data": []})
    assert merge_inventories(LLAMACPP, "/models", [empty, empty]) == (
        b'{"models":[],"object":"list","data":[]}'
    )


def test_llamacpp_models_get_the_other_names_the_filter_and_the_lan_trim() -> None:
    """What ``data`` gets, ``models`` gets: each other name once, as a copy with ``name`` and
    ``model`` renamed; a key's filter; a LAN caller's trim."""
    body = encode(
        {
            "models": [{"name": "/m/a.gguf", "model": "/m/a.gguf"}, {"name": "x", "model": "x"}],
            "object": "list",
            "data": [
                {"id": "/m/a.gguf"},
                {"id": "x", "status": {"value": "loaded", "args": ["-m"]}},
            ],
        }
    )
    names = [OtherName("a.gguf", "a.gguf", "/m/a.gguf", "/m/a.gguf")]
    merged = json.loads(
        merge_inventories(LLAMACPP, "/v1/models", [body], names, allowed=lambda n: n != "x")
    )
    assert merged["models"] == [
        {"name": "/m/a.gguf", "model": "/m/a.gguf"},
        {"name": "a.gguf", "model": "a.gguf"},
    ]
    assert [e["id"] for e in merged["data"]] == ["/m/a.gguf", "a.gguf"]
    trimmed = json.loads(merge_inventories(LLAMACPP, "/v1/models", [body], lan=True))
    assert trimmed["data"][1]["status"] == {"value": "loaded"}
    assert [e["name"] for e in trimmed["models"]] == ["/m/a.gguf", "x"]


def test_the_openai_facade_answers_data_only() -> None:
    """OpenAI's list has no ``models``: a llama.cpp node's is not carried there."""
    body = encode(
        {"models": [{"name": "a", "model": "a"}], "object": "list", "data": [{"id": "a"}]}
    )
    read_as = [LLAMACPP.inventory["/v1/models"]]
    assert merge_inventories(OPENAI, "/v1/models", [body], read_as=read_as) == (
        b'{"object":"list","data":[{"id":"a"}]}'
    )


def test_llamacpp_without_models_array_is_valid() -> None:
    body = encode({"object": "list", "data": [{"id": "a"}]})
    assert merge_inventories(LLAMACPP, "/models", [body]) == (
        b'{"object":"list","data":[{"id":"a"}]}'
    )


@pytest.mark.parametrize(
    "document",
    [
        {"models": [{"name": "a", "model": "a"}]},
        {"models": [], "object": "list"},
        {"models": [], "object": "list", "data": {"id": "a"}},
    ],
)
def test_llamacpp_without_a_data_list_is_invalid(document: object) -> None:
    with pytest.raises(InvalidInventory):
        merge_inventories(LLAMACPP, "/models", [encode(document)])


@pytest.mark.parametrize(
    "models",
    ["garbage", None, {"name": "a"}, [{"name": "a"}, "b"], [{"name": 1}], [{"model": "a"}]],
)
def test_a_malformed_llamacpp_models_is_skipped_not_fatal(models: object) -> None:
    """Only ``data`` is required: a node's ``models`` that is not a list of objects each with a
    string ``name`` adds nothing, and spoils neither the answer nor another node's ``models``."""
    bad = encode({"models": models, "object": "list", "data": [{"id": "a"}]})
    good = encode({"models": [{"name": "b"}], "object": "list", "data": [{"id": "b"}]})
    assert json.loads(merge_inventories(LLAMACPP, "/v1/models", [bad]))["data"] == [{"id": "a"}]
    assert "models" not in json.loads(merge_inventories(LLAMACPP, "/v1/models", [bad]))
    assert json.loads(merge_inventories(LLAMACPP, "/v1/models", [bad, good]))["models"] == [
        {"name": "b"}
    ]


# -- duplicates and keys -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/tags", "/api/ps", "/v1/models"])
@pytest.mark.parametrize(
    "alias",
    [
        "Llama3:latest",
        "LLAMA3",
        "library/llama3",
        "Library/Llama3:Latest",
        "registry.ollama.ai/library/llama3:latest",
    ],
)
def test_ollama_duplicates_by_normalized_name(path: str, alias: str) -> None:
    """`llama3` and its aliases are one model: the first node's entry wins, spelled as sent."""
    first = entry(OLLAMA, path, "llama3", size=1)
    merged = merge(
        OLLAMA,
        path,
        [first],
        [entry(OLLAMA, path, alias, size=2), entry(OLLAMA, path, "mistral:7b", size=3)],
    )
    assert entries_of(OLLAMA, path, merged) == [first, entry(OLLAMA, path, "mistral:7b", size=3)]


@pytest.mark.parametrize(
    "other",
    ["llama3:8b", "user/llama3", "example.com/library/llama3", "llama3:", "llama3@x"],
)
def test_ollama_distinct_names_are_kept(other: str) -> None:
    """Another tag, namespace or host is another model; an invalid name matches only itself."""
    a, b = entry(OLLAMA, "/api/ps", "llama3"), entry(OLLAMA, "/api/ps", other)
    assert entries_of(OLLAMA, "/api/ps", merge(OLLAMA, "/api/ps", [a], [b])) == [a, b]


def test_ollama_invalid_names_dedupe_exactly() -> None:
    a1, a2 = entry(OLLAMA, "/api/ps", "bad name", n=1), entry(OLLAMA, "/api/ps", "bad name", n=2)
    a3 = entry(OLLAMA, "/api/ps", "BAD NAME", n=3)
    assert entries_of(OLLAMA, "/api/ps", merge(OLLAMA, "/api/ps", [a1], [a2, a3])) == [a1, a3]


@pytest.mark.parametrize(
    ("engine", "path"),
    [(e, p) for e, p in ROUTES if e is not OLLAMA],
    ids=[i for i in ROUTE_IDS if not i.startswith("ollama")],
)
def test_exact_match_engines_are_case_sensitive(engine: Engine, path: str) -> None:
    a, b = entry(engine, path, "Qwen"), entry(engine, path, "qwen")
    c = entry(engine, path, "Qwen", second=True)
    assert entries_of(engine, path, merge(engine, path, [a, b], [c])) == [a, b]


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
def test_duplicate_within_one_node_first_wins(engine: Engine, path: str) -> None:
    a1, b, a2 = (
        entry(engine, path, "a", n=1),
        entry(engine, path, "b"),
        entry(engine, path, "a", n=2),
    )
    assert entries_of(engine, path, merge(engine, path, [a1, b, a2])) == [a1, b]


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
def test_node_order_is_kept(engine: Engine, path: str) -> None:
    """Entries in node order, then position (no modified_at here, so tags keep it too)."""
    n1 = [entry(engine, path, "z"), entry(engine, path, "a")]
    n2 = [entry(engine, path, "m"), entry(engine, path, "z", late=True), entry(engine, path, "b")]
    assert entries_of(engine, path, merge(engine, path, n1, n2)) == [*n1, n2[0], n2[2]]


def test_lmstudio_api_v1_models_keys_on_key() -> None:
    """/api/v1/models identifies a model by `key`; equal display names are distinct models."""
    a: Entry = {"key": "qwen/qwen3-8b", "display_name": "Qwen3", "type": "llm"}
    b: Entry = {"key": "qwen/qwen3-8b@q8", "display_name": "Qwen3", "type": "llm"}
    c: Entry = {"key": "qwen/qwen3-8b", "display_name": "other", "type": "llm"}
    assert merge(LMSTUDIO, "/api/v1/models", [a], [b, c]) == {"models": [a, b]}


def test_key_field_must_be_the_routes() -> None:
    """An `id` is not a `name`: Ollama's /api/tags entries need `name`."""
    with pytest.raises(InvalidInventory):
        merge_inventories(OLLAMA, "/api/tags", [encode({"models": [{"id": "llama3"}]})])


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, None, True, False, "é", "\u2603", "\U0001f600"]},
        12345678901234567890123456789,
        -0.0,
        1e-300,
        1.7976931348623157e308,
        "",
        "\ud800",
        [],
        {},
        'line\nbreak "quoted" back\\slash </script>',
    ],
)
def test_entry_fields_pass_through_unchanged(value: object) -> None:
    fields = {"name": "llama3", "details": value, "digest": "sha256:x"}
    merged = merge_inventories(OLLAMA, "/api/ps", [encode({"models": [fields]})])
    assert json.loads(merged) == {"models": [fields]}


def test_empty_string_key_is_a_key() -> None:
    """The key must be a string (docs/inventories.md#validity); "" is one, and dedupes like any
    other."""
    a, b = {"id": "", "n": 1}, {"id": "", "n": 2}
    assert merge(LMSTUDIO, "/v1/models", [a], [b]) == {"object": "list", "data": [a]}


# -- Ollama /api/tags order ----------------------------------------------------------------


def tag(name: str, modified_at: object = None, **fields: object) -> Entry:
    found: Entry = {"name": name, **fields}
    if modified_at is not None:
        found["modified_at"] = modified_at
    return found


def tag_names(*nodes: Sequence[Entry]) -> list[object]:
    return [e["name"] for e in entries_of(OLLAMA, "/api/tags", merge(OLLAMA, "/api/tags", *nodes))]


def test_tags_newest_first_across_nodes() -> None:
    n1 = [tag("old", "2024-01-01T00:00:00Z"), tag("new", "2024-06-01T00:00:00Z")]
    n2 = [tag("mid", "2024-03-01T00:00:00Z"), tag("newest", "2025-01-01T00:00:00Z")]
    assert tag_names(n1, n2) == ["newest", "new", "mid", "old"]


def test_tags_compare_instants_across_offsets() -> None:
    """Go writes local offsets: 10:00+02:00 is 08:00Z, older than 09:00Z."""
    n = [tag("a", "2024-05-01T10:00:00+02:00"), tag("b", "2024-05-01T09:00:00Z")]
    assert tag_names(n) == ["b", "a"]
    n = [tag("a", "2024-05-01T10:00:00-07:00"), tag("b", "2024-05-01T16:00:00z")]
    assert tag_names(n) == ["a", "b"]


def test_tags_compare_nanoseconds() -> None:
    """Go's RFC3339Nano keeps nine digits; two writes in one microsecond still order."""
    n = [
        tag("a", "2024-05-01T10:00:00.000000001Z"),
        tag("b", "2024-05-01T10:00:00.000000002Z"),
        tag("c", "2024-05-01T10:00:00.5Z"),
        tag("d", "2024-05-01T10:00:00Z"),
        tag("e", "2024-05-01T10:00:00.4999999999999Z"),
    ]
    assert tag_names(n) == ["c", "e", "b", "a", "d"]


def test_tags_equal_instants_keep_node_order() -> None:
    n1 = [tag("a", "2024-05-01T12:00:00Z"), tag("b", "2024-05-01T14:00:00+02:00")]
    n2 = [tag("c", "2024-05-01T12:00:00.000Z"), tag("d", "2024-05-01T05:00:00-07:00")]
    assert tag_names(n1, n2) == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    "undated",
    [
        None,
        "",
        "yesterday",
        12345,
        ["2024-05-01T12:00:00Z"],
        "2024-05-01",
        "2024-05-01T12:00:00",  # no offset
        "2024-05-01 12:00:00Z",
        "2024-02-30T12:00:00Z",
        "2024-05-01T24:00:00Z",
        "2024-05-01T12:60:00Z",
        "2024-05-01T12:00:61Z",
        "2024-05-01T12:00:00+24:00",
        "2024-05-01T12:00:00+0200",
        "2024-05-01T12:00:00.Z",
        "\u0662024-05-01T12:00:00Z",  # an Arabic-Indic digit
        " 2024-05-01T12:00:00Z",
    ],
)
def test_undated_entries_sort_last_in_node_order(undated: object) -> None:
    """Missing or unparseable modified_at counts as oldest; undated entries keep node order."""
    n1 = [tag("u1", undated), tag("old", "1999-01-01T00:00:00Z")]
    n2 = [tag("u2", undated), tag("zero", "0001-01-01T00:00:00Z")]
    assert tag_names(n1, n2) == ["old", "zero", "u1", "u2"]


def test_go_zero_time_with_offset_and_leap_second_parse() -> None:
    n = [
        tag("zero", "0001-01-01T00:00:00+14:00"),
        tag("leap", "2016-12-31T23:59:60Z"),
        tag("after", "2017-01-01T00:00:00.5Z"),
    ]
    assert tag_names(n) == ["after", "leap", "zero"]


def test_tags_dedupe_before_sorting() -> None:
    """First occurrence (node order) wins even when a later duplicate is newer."""
    n1 = [tag("llama3", "2024-01-01T00:00:00Z", node=1)]
    n2 = [tag("Llama3:latest", "2025-01-01T00:00:00Z", node=2), tag("m", "2024-06-01T00:00:00Z")]
    merged = entries_of(OLLAMA, "/api/tags", merge(OLLAMA, "/api/tags", n1, n2))
    assert merged == [n2[1], n1[0]]


@pytest.mark.parametrize("path", ["/api/ps", "/v1/models"])
def test_only_tags_is_sorted(path: str) -> None:
    n = [
        entry(OLLAMA, path, "a", modified_at="2020-01-01T00:00:00Z"),
        entry(OLLAMA, path, "b", modified_at="2025-01-01T00:00:00Z"),
    ]
    assert entries_of(OLLAMA, path, merge(OLLAMA, path, n)) == n


# -- invalid bodies ------------------------------------------------------------------------

RAW_INVALID = [
    b"",
    b" ",
    b"not json",
    b"{",
    b"[]",
    b"null",
    b"true",
    b'"models"',
    b"1",
    b"\xff\xfe\xff",
    b'{"a":1} trailing',
    b"{}",
    b'{"models":NaN,"data":NaN}',
    b'{"models":[{"name":"a","x":NaN}],"data":[{"id":"a","key":"a","x":NaN}]}',
    b'{"models":[{"name":"a","key":"a","x":Infinity}],"data":[{"id":"a","x":-Infinity}]}',
    b'{"models":[{"name":"a","key":"a","x":1e400}],"data":[{"id":"a","x":-1e400}]}',
    b'{"models":[{"name":"a","key":"a","x":' + b"1" * 5000 + b"}]}",
    b"[" * 100_000 + b"]" * 100_000,
]


def shaped_invalid(engine: Engine, path: str) -> list[object]:
    """Documents that are objects but not this route's envelope."""
    route = engine.inventory[path]
    key, field = route.key_field, route.list_field
    good = {key: "m"}
    return [
        {"object": "list"},
        {field: {}},
        {field: good},
        {field: "m"},
        {field: 1},
        {field: True},
        {field: [good, 1]},
        {field: [good, None]},
        {field: [good, "m"]},
        {field: [good, [good]]},
        {field: [good, {}]},
        {field: [{key: None}]},
        {field: [{key: 1}]},
        {field: [{key: ["m"]}]},
        {field: [{key: {"m": 1}}]},
        {field: [{key.upper(): "m"}]},
        {field.upper(): [good]},
    ]


INVALID_CASES = [
    pytest.param(engine, path, body, id=f"{engine.id}{path}-{n}")
    for engine, path in ROUTES
    for n, body in enumerate(RAW_INVALID + [encode(d) for d in shaped_invalid(engine, path)])
]


@pytest.mark.parametrize(("engine", "path", "body"), INVALID_CASES)
def test_invalid_body_raises(engine: Engine, path: str, body: bytes) -> None:
    with pytest.raises(InvalidInventory) as caught:
        merge_inventories(engine, path, [body])
    assert caught.value.index == 0


@pytest.mark.parametrize(("engine", "path"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("position", [0, 1, 2])
def test_one_invalid_responder_spoils_the_list(engine: Engine, path: str, position: int) -> None:
    """No partial list: any invalid body raises, naming its position."""
    bodies = [envelope(engine, path, [entry(engine, path, f"m{i}")]) for i in range(3)]
    bodies[position] = b'{"not":"an envelope"}'
    with pytest.raises(InvalidInventory) as caught:
        merge_inventories(engine, path, bodies)
    assert caught.value.index == position


def test_invalid_after_only_duplicates_still_raises() -> None:
    """Bodies are validated even when every entry would be dropped as a duplicate."""
    good = envelope(OLLAMA, "/api/ps", [entry(OLLAMA, "/api/ps", "a")])
    bad = encode({"models": [{"name": "a"}, {"name": 7}]})
    with pytest.raises(InvalidInventory):
        merge_inventories(OLLAMA, "/api/ps", [good, bad])


def test_invalid_inventory_message_leaves_the_body_out() -> None:
    """Bodies never reach logs (docs/README.md#logging): the message names the node and the
    fault only."""
    with pytest.raises(InvalidInventory) as caught:
        merge_inventories(OLLAMA, "/api/ps", [b'{"models":[{"secret-prompt":1}]}'])
    assert "secret-prompt" not in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert caught.value.reason


def test_bom_prefixed_utf8_is_accepted() -> None:
    body = b"\xef\xbb\xbf" + encode({"object": "list", "data": [{"id": "a"}]})
    assert merge_inventories(LMSTUDIO, "/v1/models", [body]) == (
        b'{"object":"list","data":[{"id":"a"}]}'
    )


def test_unknown_route_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        merge_inventories(OLLAMA, "/api/version", [])
    with pytest.raises(KeyError):
        empty_inventory(LMSTUDIO, "/api/tags")


# -- properties ----------------------------------------------------------------------------

OLLAMA_NAMES = [
    "llama3",
    "Llama3:latest",
    "library/llama3",
    "llama3:8b",
    "LLAMA3:8B",
    "mistral",
    "user/mistral:7b",
    "bad name",
]
EXACT_NAMES = ["a", "A", "b", "qwen/qwen3-8b", "c.gguf"]

_BASE = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
INSTANTS = [_BASE + timedelta(seconds=s, microseconds=us) for s in (0, 1, 3600) for us in (0, 7)]
ZONES = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7, minutes=-30))]


def go_time(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


MODIFIED = st.one_of(
    st.none(),
    st.just("garbage"),
    st.builds(
        lambda i, z: go_time(i.astimezone(z)), st.sampled_from(INSTANTS), st.sampled_from(ZONES)
    ),
)


def modified_instant(entry: Entry) -> datetime | None:
    """Oracle: Python's own ISO parser, independent of the module's."""
    value = entry.get("modified_at")
    if not isinstance(value, str) or value == "garbage":
        return None
    return datetime.fromisoformat(value)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[Engine, str, list[list[Entry]]]:
    """A route and its nodes' entries, each tagged with where it came from."""
    engine, path = draw(st.sampled_from(ROUTES))
    names = OLLAMA_NAMES if engine is OLLAMA else EXACT_NAMES
    nodes: list[list[Entry]] = []
    for node in range(draw(st.integers(0, 4))):
        entries: list[Entry] = []
        for position in range(draw(st.integers(0, 5))):
            found = entry(engine, path, draw(st.sampled_from(names)), at=[node, position])
            modified = draw(MODIFIED)
            if modified is not None:
                found["modified_at"] = modified
            entries.append(found)
        nodes.append(entries)
    return engine, path, nodes


def origin_of(entry: Entry) -> tuple[int, int]:
    """The (node, position) a generated entry came from."""
    at = entry["at"]
    assert isinstance(at, list)
    return (int(at[0]), int(at[1]))


def is_sorted_route(engine: Engine, path: str) -> bool:
    return (engine.id, path) == ("ollama", "/api/tags")


def first_occurrences(engine: Engine, path: str, nodes: list[list[Entry]]) -> list[Entry]:
    """Oracle: the concatenation, keeping the first entry of each model key."""
    key_field = engine.inventory[path].key_field
    seen: set[str] = set()
    kept: list[Entry] = []
    for node in nodes:
        for e in node:
            key = engine.model_key(str(e[key_field]))
            if key not in seen:
                seen.add(key)
                kept.append(e)
    return kept


def newest_first(entries: list[Entry]) -> list[Entry]:
    """Oracle for /api/tags: stable, dated newest first, undated last."""
    dated = [(instant, e) for e in entries if (instant := modified_instant(e)) is not None]
    undated = [e for e in entries if modified_instant(e) is None]
    dated.sort(key=lambda pair: pair[0], reverse=True)
    return [e for _, e in dated] + undated


def expected(engine: Engine, path: str, nodes: list[list[Entry]]) -> list[Entry]:
    kept = first_occurrences(engine, path, nodes)
    return newest_first(kept) if is_sorted_route(engine, path) else kept


def merged_bytes(engine: Engine, path: str, nodes: list[list[Entry]]) -> bytes:
    return merge_inventories(engine, path, [envelope(engine, path, n) for n in nodes])


@given(fleets())
def test_merge_is_first_occurrence_in_node_order(
    fleet: tuple[Engine, str, list[list[Entry]]],
) -> None:
    """First occurrence wins, node order kept (then newest first on /api/tags, stably)."""
    engine, path, nodes = fleet
    merged = entries_of(engine, path, json.loads(merged_bytes(engine, path, nodes)))
    assert merged == expected(engine, path, nodes)


@given(fleets())
def test_each_node_keeps_its_relative_order(fleet: tuple[Engine, str, list[list[Entry]]]) -> None:
    engine, path, nodes = fleet
    merged = entries_of(engine, path, json.loads(merged_bytes(engine, path, nodes)))
    for node in range(len(nodes)):
        mine = [e for e in merged if origin_of(e)[0] == node]
        if is_sorted_route(engine, path):
            # Sorted newest first; within one instant (or among the undated), node order.
            groups: dict[datetime | None, list[tuple[int, int]]] = {}
            for e in mine:
                groups.setdefault(modified_instant(e), []).append(origin_of(e))
            assert all(g == sorted(g) for g in groups.values())
        else:
            positions = [origin_of(e) for e in mine]
            assert positions == sorted(positions)


@given(fleets())
def test_single_node_merge_is_its_own_entries(fleet: tuple[Engine, str, list[list[Entry]]]) -> None:
    engine, path, nodes = fleet
    key_field = engine.inventory[path].key_field
    for node in nodes:
        unique = first_occurrences(engine, path, [node])
        if len(unique) != len(node):
            continue
        merged = entries_of(engine, path, json.loads(merged_bytes(engine, path, [node])))
        assert merged == (newest_first(node) if is_sorted_route(engine, path) else node)
        assert {str(e[key_field]) for e in merged} == {str(e[key_field]) for e in node}


@given(fleets())
def test_merge_is_idempotent(fleet: tuple[Engine, str, list[list[Entry]]]) -> None:
    engine, path, nodes = fleet
    once = merged_bytes(engine, path, nodes)
    assert merge_inventories(engine, path, [once]) == once
    assert merge_inventories(engine, path, [once, once]) == once


@given(fleets(), st.data())
def test_merging_groups_equals_merging_all(
    fleet: tuple[Engine, str, list[list[Entry]]], data: st.DataObject
) -> None:
    """Merging merged halves gives the same answer as merging every node at once."""
    engine, path, nodes = fleet
    cut = data.draw(st.integers(0, len(nodes)))
    halves = [merged_bytes(engine, path, nodes[:cut]), merged_bytes(engine, path, nodes[cut:])]
    assert merge_inventories(engine, path, halves) == merged_bytes(engine, path, nodes)


@given(fleets(), st.data())
def test_any_invalid_body_raises(
    fleet: tuple[Engine, str, list[list[Entry]]], data: st.DataObject
) -> None:
    engine, path, nodes = fleet
    bodies = [envelope(engine, path, n) for n in nodes]
    position = data.draw(st.integers(0, len(bodies)))
    bad = data.draw(
        st.sampled_from([*RAW_INVALID[:17], *map(encode, shaped_invalid(engine, path))])
    )
    bodies.insert(position, bad)
    with pytest.raises(InvalidInventory) as caught:
        merge_inventories(engine, path, bodies)
    assert caught.value.index == position


def test_a_keys_patterns_filter_the_merged_list_after_validation() -> None:
    """A key with model patterns sees only what it may use (docs/lan.md#keys); a node's
    invalid list is still refused whole, whatever the key may see."""
    bodies = [
        json.dumps({"models": [{"name": "llama3:latest"}, {"name": "mistral:latest"}]}).encode(),
        json.dumps({"models": [{"name": "llama3.1:8b"}]}).encode(),
    ]
    merged = merge_inventories(OLLAMA, "/api/tags", bodies, allowed=lambda name: "llama3" in name)
    assert [m["name"] for m in json.loads(merged)["models"]] == ["llama3:latest", "llama3.1:8b"]
    none = merge_inventories(OLLAMA, "/api/tags", bodies, allowed=lambda name: False)
    assert none == empty_inventory(OLLAMA, "/api/tags")
    with pytest.raises(InvalidInventory):
        merge_inventories(OLLAMA, "/api/tags", [*bodies, b"{}"], allowed=lambda name: False)


def test_a_keys_patterns_judge_derived_names_and_aliases_by_their_own_name() -> None:
    """The names the fleet adds (a GGUF file name, a ``[models]`` alias) are listed to a key
    only if it may use them, whatever it may use of the model behind them — and an alias it
    may use is listed though the model behind it is not (docs/lan.md#keys)."""
    path = "/v1/models"
    reported = "/models/qwen2.5-7b-q4.gguf"
    body = json.dumps({"object": "list", "data": [{"id": reported, "object": "model"}]}).encode()
    names = [
        OtherName(n, LLAMACPP.model_key(n), reported, LLAMACPP.model_key(reported))
        for n in ("qwen2.5-7b-q4.gguf", "qwen2.5-7b-q4", "qwen")
    ]

    def listed(allowed: Callable[[str], bool] | None) -> list[str]:
        merged = merge_inventories(LLAMACPP, path, [body], names, allowed=allowed)
        return [m["id"] for m in json.loads(merged)["data"]]

    assert listed(None) == [reported, "qwen2.5-7b-q4.gguf", "qwen2.5-7b-q4", "qwen"]
    assert listed(lambda name: name == "qwen") == ["qwen"]
    assert listed(lambda name: name.startswith("qwen2.5")) == [
        "qwen2.5-7b-q4.gguf",
        "qwen2.5-7b-q4",
    ]
    assert listed(lambda name: name == reported) == [reported]


def test_a_lan_caller_sees_no_router_command_line() -> None:
    """A llama.cpp router's ``status.args`` and ``status.preset`` carry the node's file
    paths: left out for a LAN caller, kept for the operator's own machine
    (docs/lan.md#what-a-key-can-and-cannot-do)."""
    entry = {
        "id": "alpha",
        "status": {"value": "loaded", "args": ["llama-server", "-m", "/srv/a.gguf"], "preset": "x"},
    }
    body = json.dumps({"object": "list", "data": [entry, {"id": "beta"}]}).encode()
    lan = json.loads(merge_inventories(LLAMACPP, "/v1/models", [body], lan=True))
    assert lan["data"] == [{"id": "alpha", "status": {"value": "loaded"}}, {"id": "beta"}]
    local = json.loads(merge_inventories(LLAMACPP, "/v1/models", [body]))
    assert local["data"][0] == entry
