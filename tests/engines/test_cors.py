"""Browser-policy intersection (docs/browser-policy.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.engines.cors import (
    ALLOW_CREDENTIALS,
    ALLOW_HEADERS,
    ALLOW_METHODS,
    ALLOW_ORIGIN,
    EXPOSE_HEADERS,
    MAX_AGE,
    VARY,
    Decision,
    Reply,
    inventory_grant,
    preflight,
)

ORIGIN = b"http://app.example"
OTHER = b"http://evil.example"

Fields = Mapping[bytes, Sequence[bytes]]


def reply(status: int = 204, **fields: bytes | list[bytes]) -> Reply:
    """A responder; ``allow_origin=b"*"`` is ``access-control-allow-origin: *``.

    A list value is several field lines of the same header.
    """
    headers: dict[bytes, list[bytes]] = {}
    for key, value in fields.items():
        name = key.encode().replace(b"_", b"-")
        if name != b"vary":
            name = b"access-control-" + name
        headers[name] = value if isinstance(value, list) else [value]
    return Reply(status, headers)


def header(decision: Decision, name: bytes) -> bytes | None:
    values = [v for n, v in decision.headers if n == name]
    assert len(values) <= 1, f"{name!r} sent twice"
    return values[0] if values else None


# What the engines really send (nvpair/sim/cors.py mirrors their sources).
OLLAMA_PREFLIGHT = reply(
    204,
    allow_origin=ORIGIN,
    allow_methods=b"GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS",
    allow_headers=b"Authorization,Content-Type,User-Agent,Accept,X-Requested-With,Openai-Beta",
    max_age=b"43200",
    vary=[b"Origin", b"Access-Control-Request-Method", b"Access-Control-Request-Headers"],
)
LMSTUDIO_PREFLIGHT = reply(
    204,
    allow_origin=b"*",
    allow_methods=b"GET,HEAD,PUT,PATCH,POST,DELETE",
    allow_headers=b"content-type",
    vary=b"Access-Control-Request-Headers",
)
LMSTUDIO_NO_CORS = Reply(200, {b"content-type": [b"application/json"]})
LLAMACPP_PREFLIGHT = reply(
    200,
    allow_origin=ORIGIN,
    allow_credentials=b"true",
    allow_methods=b"GET, POST, DELETE, OPTIONS",
    allow_headers=b"*",
)
OLLAMA_FOREIGN = Reply(403, {})


# -- preflight: who grants -----------------------------------------------------------------


def test_single_ollama_preflight_passes_through_intersected() -> None:
    """One responder: its own permissions, answered as 204 with Vary: Origin."""
    decision = preflight(ORIGIN, [OLLAMA_PREFLIGHT])
    assert decision == Decision(
        204,
        (
            (ALLOW_ORIGIN, ORIGIN),
            (ALLOW_METHODS, b"GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"),
            (
                ALLOW_HEADERS,
                b"Authorization, Content-Type, User-Agent, Accept, X-Requested-With, Openai-Beta",
            ),
            (MAX_AGE, b"43200"),
            (VARY, b"Origin"),
        ),
        True,
    )


def test_three_engines_intersect() -> None:
    """Ollama ∩ LM Studio ∩ llama.cpp: common methods, LM Studio's one header, no credentials."""
    decision = preflight(ORIGIN, [OLLAMA_PREFLIGHT, LMSTUDIO_PREFLIGHT, LLAMACPP_PREFLIGHT])
    assert decision == Decision(
        204,
        (
            (ALLOW_ORIGIN, ORIGIN),
            (ALLOW_METHODS, b"GET, POST, DELETE"),
            (ALLOW_HEADERS, b"Content-Type"),
            (MAX_AGE, b"43200"),
            (VARY, b"Origin"),
        ),
        True,
    )


@pytest.mark.parametrize(
    ("replies", "status"),
    [
        ([OLLAMA_FOREIGN], 403),
        ([LMSTUDIO_NO_CORS], 200),
        ([OLLAMA_PREFLIGHT, OLLAMA_FOREIGN, LMSTUDIO_NO_CORS], 403),
        ([OLLAMA_PREFLIGHT, LMSTUDIO_NO_CORS, OLLAMA_FOREIGN], 200),
        ([reply(404, allow_origin=b"*")], 404),
        ([reply(500, allow_origin=ORIGIN)], 500),
        ([reply(301, allow_origin=b"*")], 301),
        ([LLAMACPP_PREFLIGHT, reply(204, allow_origin=OTHER)], 204),
    ],
)
def test_first_non_granting_status_without_headers(replies: list[Reply], status: int) -> None:
    """A denial passes through as the first non-granting responder's status, no CORS headers."""
    assert preflight(ORIGIN, replies) == Decision(status, (), False)


@pytest.mark.parametrize(
    ("values", "grants"),
    [
        ([b"*"], True),
        ([ORIGIN], True),
        ([b" * "], True),
        ([b"\t" + ORIGIN + b" "], True),
        ([b""], False),
        ([OTHER], False),
        ([b"HTTP://APP.EXAMPLE"], False),
        ([ORIGIN + b"/"], False),
        ([b"null"], False),
        ([b"*", b"*"], False),
        ([ORIGIN, ORIGIN], False),
        ([b"*, *"], False),
        ([ORIGIN + b", " + OTHER], False),
        ([b"**"], False),
        ([], False),
    ],
)
def test_allow_origin_values(values: list[bytes], grants: bool) -> None:
    """ACAO is read as a browser reads it: one value, trimmed, `*` or the exact Origin."""
    replies = [Reply(204, {ALLOW_ORIGIN: values})]
    assert preflight(ORIGIN, replies).granted is grants
    assert inventory_grant(ORIGIN, replies).granted is grants


def test_absent_allow_origin_denies() -> None:
    assert not preflight(ORIGIN, [Reply(204, {})]).granted
    assert not inventory_grant(ORIGIN, [Reply(200, {})]).granted


def test_empty_allow_origin_never_matches_even_an_empty_origin() -> None:
    """llama.cpp reflects a missing Origin as an empty ACAO; that is no grant."""
    replies = [reply(200, allow_origin=b"")]
    assert not preflight(b"", replies).granted
    assert not inventory_grant(b"", replies).granted


def test_literal_null_origin_is_echoed_like_any_other() -> None:
    """A sandboxed page's Origin is `null`; an engine that echoes it grants it."""
    decision = preflight(b"null", [reply(204, allow_origin=b"null")])
    assert decision.granted
    assert header(decision, ALLOW_ORIGIN) == b"null"


def test_mixed_case_header_names_are_still_found() -> None:
    """Names should arrive lower-case; a mixed-case key must not read as a missing header."""
    decision = preflight(ORIGIN, [Reply(204, {b"Access-Control-Allow-Origin": [b"*"]})])
    assert decision.granted


def test_preflight_needs_a_responder() -> None:
    """No responders is the caller's 502; an empty list is a caller bug."""
    with pytest.raises(ValueError):
        preflight(ORIGIN, [])
    with pytest.raises(ValueError):
        inventory_grant(ORIGIN, [])


# -- preflight: what the answer carries ----------------------------------------------------


@pytest.mark.parametrize(
    ("origins", "expected", "vary"),
    [
        ([b"*"], b"*", False),
        ([b"*", b"*", b"*"], b"*", False),
        ([ORIGIN], ORIGIN, True),
        ([b"*", ORIGIN], ORIGIN, True),
        ([ORIGIN, b"*"], ORIGIN, True),
        ([ORIGIN, ORIGIN], ORIGIN, True),
    ],
)
def test_allow_origin_and_vary(origins: list[bytes], expected: bytes, vary: bool) -> None:
    """`*` only when every responder said `*`; an echoed Origin always comes with Vary."""
    for combine in (preflight, inventory_grant):
        decision = combine(ORIGIN, [reply(200, allow_origin=o) for o in origins])
        assert header(decision, ALLOW_ORIGIN) == expected
        assert header(decision, VARY) == (b"Origin" if vary else None)


def test_answer_is_204_whatever_2xx_the_responders_used() -> None:
    decision = preflight(ORIGIN, [reply(200, allow_origin=b"*"), reply(204, allow_origin=b"*")])
    assert decision.status == 204


def test_upstream_vary_is_not_passed_through() -> None:
    """Only the proxy's own Vary: Origin is sent; the engines' Vary lines describe them."""
    decision = preflight(ORIGIN, [LMSTUDIO_PREFLIGHT])
    assert header(decision, VARY) is None
    assert [name for name, _ in decision.headers].count(VARY) == 0


Lists = list[bytes | list[bytes] | None]


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        # case-insensitive, first responder's spelling and order
        ([b"GET, POST", b"post, get"], b"GET, POST"),
        ([b"post,GET", b"GET, POST, PUT"], b"post, GET"),
        # whitespace, empty items, duplicates inside one responder
        ([b" GET ,, POST,\tGET ,", b"GET,POST"], b"GET, POST"),
        ([b"Post, POST, get", b"GET, post"], b"Post, get"),
        # `*` means any
        ([b"*", b"GET, POST"], b"GET, POST"),
        ([b"GET, POST", b"*"], b"GET, POST"),
        ([b"*", b"*"], b"*"),
        ([b"*"], b"*"),
        ([b"GET, *", b"*"], b"*"),
        ([b"*", b"PUT", b"put, get"], b"PUT"),
        # several field lines are one list
        ([[b"GET", b"POST"], b"POST, PUT"], b"POST"),
        ([[b"GET, PUT", b"*"], b"DELETE"], b"DELETE"),
        # omitted: empty intersection, or any responder omitted the header
        ([b"GET", b"POST"], None),
        ([b"GET", None], None),
        ([None, b"*"], None),
        ([b"", b"GET"], None),
        ([b" , ", b"*"], None),
    ],
)
def test_allow_methods_intersection(lists: Lists, expected: bytes | None) -> None:
    """Allow-Methods: the case-insensitive intersection, `*` standing for any."""
    replies = [
        reply(204, allow_origin=b"*", **({} if m is None else {"allow_methods": m})) for m in lists
    ]
    assert header(preflight(ORIGIN, replies), ALLOW_METHODS) == expected


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ([b"Content-Type, X-Api-Key", b"x-api-key, content-type"], b"Content-Type, X-Api-Key"),
        ([b"*", b"content-type"], b"content-type"),
        ([b"*", b"*"], b"*"),
        ([b"Content-Type", None], None),
        # `*` never covers Authorization (Fetch): it survives only where named by all...
        ([b"*", b"Authorization, Content-Type"], b"Content-Type"),
        ([b"Authorization, Content-Type", b"*"], b"Content-Type"),
        ([b"*", b"Authorization"], None),
        # ...or where a wildcard responder names it too
        ([b"*, Authorization", b"Authorization, Content-Type"], b"Authorization, Content-Type"),
        ([b"*, authorization", b"*, Authorization"], b"*, authorization"),
        ([b"*, Authorization", b"*"], b"*"),
        ([b"*, Content-Type", b"*"], b"*"),
    ],
)
def test_allow_headers_intersection(lists: Lists, expected: bytes | None) -> None:
    """Allow-Headers: as methods, except that `*` does not grant Authorization."""
    replies = [
        reply(204, allow_origin=b"*", **({} if h is None else {"allow_headers": h})) for h in lists
    ]
    assert header(preflight(ORIGIN, replies), ALLOW_HEADERS) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([b"true"], True),
        ([b"true", b"true"], True),
        ([b"TRUE", b" True "], True),
        ([b"true", None], False),
        ([None], False),
        ([b"false"], False),
        ([b"true", b"yes"], False),
        ([b"true", [b"true", b"true"]], False),
        ([b"true, true"], False),
        ([b""], False),
    ],
)
def test_allow_credentials(values: list[bytes | list[bytes] | None], expected: bool) -> None:
    """`true` only if every responder sent exactly one `true` (case-insensitive)."""
    replies = [
        reply(204, allow_origin=b"*", **({} if v is None else {"allow_credentials": v}))
        for v in values
    ]
    for combine in (preflight, inventory_grant):
        assert header(combine(ORIGIN, replies), ALLOW_CREDENTIALS) == (
            b"true" if expected else None
        )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([b"600", b"43200", b"7200"], b"600"),
        ([b"43200", b"600"], b"600"),
        ([b"600", None], b"600"),
        ([None, None], None),
        ([b"0", b"600"], b"0"),
        ([b"0010", b"9"], b"9"),
        ([b"000"], b"0"),
        ([b" 300 "], b"300"),
        ([b"-1", b"600"], b"600"),
        ([b"1.5", b"10s", b"", b"abc"], None),
        ([[b"5", b"10"], b"600"], b"600"),
        ([b"5, 10"], None),
        ([b"\xd9\xa3"], None),  # an Arabic-Indic digit is not DIGIT
        (
            [b"99999999999999999999999999", b"100000000000000000000000000"],
            b"99999999999999999999999999",
        ),
        ([b"9" * 5000, b"12"], b"12"),
    ],
)
def test_max_age(values: list[bytes | list[bytes] | None], expected: bytes | None) -> None:
    """The smallest valid value sent; invalid values constrain nothing; omitted if none."""
    replies = [
        reply(204, allow_origin=b"*", **({} if v is None else {"max_age": v})) for v in values
    ]
    assert header(preflight(ORIGIN, replies), MAX_AGE) == expected


def test_preflight_header_order_is_fixed() -> None:
    replies = [
        reply(
            204,
            max_age=b"5",
            allow_credentials=b"true",
            allow_headers=b"a",
            allow_methods=b"GET",
            allow_origin=ORIGIN,
        )
    ]
    names = [name for name, _ in preflight(ORIGIN, replies).headers]
    assert names == [ALLOW_ORIGIN, ALLOW_METHODS, ALLOW_HEADERS, ALLOW_CREDENTIALS, MAX_AGE, VARY]


def test_preflight_never_sends_expose_headers() -> None:
    decision = preflight(ORIGIN, [reply(204, allow_origin=b"*", expose_headers=b"X-A")])
    assert header(decision, EXPOSE_HEADERS) is None


# -- inventory with Origin -----------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 204, 403, 404, 500, 502])
def test_inventory_grant_ignores_status(status: int) -> None:
    """Validity is the caller's question; a granting ACAO grants whatever the status."""
    assert inventory_grant(ORIGIN, [reply(status, allow_origin=b"*")]) == Decision(
        200, ((ALLOW_ORIGIN, b"*"),), True
    )


@pytest.mark.parametrize(
    "replies",
    [
        [OLLAMA_FOREIGN],
        [LMSTUDIO_NO_CORS],
        [reply(200, allow_origin=b"*"), LMSTUDIO_NO_CORS],
        [reply(200, allow_origin=ORIGIN), reply(200, allow_origin=OTHER)],
        [reply(200, allow_origin=b"*"), reply(500, allow_origin=b"")],
    ],
)
def test_inventory_denial_is_403_without_headers(replies: list[Reply]) -> None:
    assert inventory_grant(ORIGIN, replies) == Decision(403, (), False)


def test_inventory_grant_full_header_set_in_order() -> None:
    replies = [
        reply(
            200,
            allow_origin=ORIGIN,
            allow_credentials=b"true",
            expose_headers=b"X-Request-Id, X-Model",
            allow_methods=b"GET",
            allow_headers=b"*",
            max_age=b"5",
        ),
        reply(200, allow_origin=b"*", allow_credentials=b"TRUE", expose_headers=b"x-model"),
    ]
    assert inventory_grant(ORIGIN, replies) == Decision(
        200,
        (
            (ALLOW_ORIGIN, ORIGIN),
            (ALLOW_CREDENTIALS, b"true"),
            (EXPOSE_HEADERS, b"X-Model"),
            (VARY, b"Origin"),
        ),
        True,
    )


@pytest.mark.parametrize(
    ("lists", "expected"),
    [
        ([b"X-A, X-B", b"x-b"], b"X-B"),
        ([b"*", b"X-A"], b"X-A"),
        ([b"*", b"*"], b"*"),
        ([b"*", b"Authorization"], b"Authorization"),  # `*` exposes Authorization too
        ([b"X-A", None], None),
        ([b"X-A", b"X-B"], None),
        ([[b"X-A", b"X-B"], b"X-B, X-C"], b"X-B"),
    ],
)
def test_inventory_expose_headers(lists: Lists, expected: bytes | None) -> None:
    replies = [
        reply(200, allow_origin=b"*", **({} if e is None else {"expose_headers": e})) for e in lists
    ]
    assert header(inventory_grant(ORIGIN, replies), EXPOSE_HEADERS) == expected


# -- properties ----------------------------------------------------------------------------

METHOD_POOL = [b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD"]
HEADER_POOL = [b"Content-Type", b"Authorization", b"X-Api-Key", b"Openai-Beta"]
UNLISTED = b"x-never-listed"  # granted only by a wildcard

_OWS_SEPARATORS = [b",", b", ", b" ,\t", b" , "]


@st.composite
def token_lines(draw: st.DrawFn, pool: list[bytes]) -> list[bytes]:
    """A list header as field lines: tokens from *pool* (any case) or `*`, split over lines."""
    spelled = st.sampled_from([*pool, b"*"]).flatmap(
        lambda t: st.sampled_from([t, t.lower(), t.upper()])
    )
    tokens = draw(st.lists(spelled, max_size=6))
    cut = draw(st.integers(0, len(tokens)))
    groups = [tokens[:cut], tokens[cut:]] if draw(st.booleans()) else [tokens]
    return [draw(st.sampled_from(_OWS_SEPARATORS)).join(g) for g in groups]


def optional(strategy: st.SearchStrategy[list[bytes]]) -> st.SearchStrategy[list[bytes] | None]:
    return st.one_of(st.none(), strategy)


GRANTING_ORIGIN = st.sampled_from([[b"*"], [ORIGIN], [b" * "]])
ANY_ORIGIN = st.one_of(
    GRANTING_ORIGIN, st.sampled_from([[], [b""], [OTHER], [b"*", b"*"], [ORIGIN, b"*"]])
)
CREDENTIALS = st.sampled_from([[], [b"true"], [b"TRUE"], [b"false"], [b"true", b"true"]])
AGES = st.one_of(
    st.just(list[bytes]()),
    st.lists(st.integers(0, 100_000).map(lambda n: str(n).encode()), min_size=1, max_size=2),
    st.sampled_from([[b"-1"], [b"x"], [b""]]),
)


@st.composite
def replies(
    draw: st.DrawFn, origin: st.SearchStrategy[list[bytes]], statuses: Sequence[int]
) -> Reply:
    headers: dict[bytes, list[bytes]] = {}
    for name, value in (
        (ALLOW_ORIGIN, draw(origin)),
        (ALLOW_METHODS, draw(optional(token_lines(METHOD_POOL)))),
        (ALLOW_HEADERS, draw(optional(token_lines(HEADER_POOL)))),
        (EXPOSE_HEADERS, draw(optional(token_lines(HEADER_POOL)))),
        (ALLOW_CREDENTIALS, draw(CREDENTIALS)),
        (MAX_AGE, draw(AGES)),
    ):
        if value:
            headers[name] = value
    return Reply(draw(st.sampled_from(statuses)), headers)


GRANTING = st.lists(replies(GRANTING_ORIGIN, [200, 204]), min_size=1, max_size=5)
MIXED = st.lists(replies(ANY_ORIGIN, [200, 204, 204, 403, 404, 500]), min_size=1, max_size=5)


def allowed(values: Sequence[bytes] | None, name: bytes) -> Callable[[bytes], bool]:
    """Oracle, straight from Fetch: which tokens a list header grants."""
    if values is None:
        return lambda token: False
    tokens = {t.strip(b" \t").lower() for v in values for t in v.split(b",")}
    wildcard = b"*" in tokens

    def grants(token: bytes) -> bool:
        folded = token.lower()
        if folded in tokens:
            return True
        return wildcard and not (name == ALLOW_HEADERS and folded == b"authorization")

    return grants


def universe(pool: list[bytes]) -> list[bytes]:
    return [t.lower() for t in pool] + [UNLISTED]


def granted_set(decision: Decision, name: bytes, pool: list[bytes]) -> frozenset[bytes]:
    value = header(decision, name)
    grants = allowed(None if value is None else [value], name)
    return frozenset(t for t in universe(pool) if grants(t))


def responder_sets(replies: Sequence[Reply], name: bytes, pool: list[bytes]) -> frozenset[bytes]:
    """What every responder grants: the exact intersection the answer should carry."""
    common = frozenset(universe(pool))
    for r in replies:
        grants = allowed(r.headers.get(name), name)
        common &= frozenset(t for t in common if grants(t))
    return common


LIST_HEADERS = [(ALLOW_METHODS, METHOD_POOL), (ALLOW_HEADERS, HEADER_POOL)]


@given(GRANTING)
def test_preflight_grants_exactly_the_intersection(rs: list[Reply]) -> None:
    """Never more than any responder (and nothing any responder-set shares is lost)."""
    decision = preflight(ORIGIN, rs)
    assert decision.granted and decision.status == 204
    for name, pool in LIST_HEADERS:
        if any(name not in r.headers for r in rs):
            assert header(decision, name) is None
        else:
            assert granted_set(decision, name, pool) == responder_sets(rs, name, pool)


@given(GRANTING)
def test_preflight_credentials_and_max_age_never_exceed_a_responder(rs: list[Reply]) -> None:
    decision = preflight(ORIGIN, rs)
    if header(decision, ALLOW_CREDENTIALS) is not None:
        assert all(
            [v.strip().lower() for v in r.headers.get(ALLOW_CREDENTIALS, [])] == [b"true"]
            for r in rs
        )
    sent = [
        int(r.headers[MAX_AGE][0])
        for r in rs
        if len(r.headers.get(MAX_AGE, [])) == 1 and r.headers[MAX_AGE][0].isdigit()
    ]
    age = header(decision, MAX_AGE)
    if sent:
        assert age is not None and int(age) == min(sent)
    else:
        assert age is None
    acao = header(decision, ALLOW_ORIGIN)
    everyone_star = all(r.headers[ALLOW_ORIGIN][0].strip() == b"*" for r in rs)
    assert acao == (b"*" if everyone_star else ORIGIN)
    assert (header(decision, VARY) is None) is everyone_star


@given(GRANTING)
def test_inventory_grant_never_exceeds_a_responder(rs: list[Reply]) -> None:
    decision = inventory_grant(ORIGIN, rs)
    assert decision.granted and decision.status == 200
    if any(EXPOSE_HEADERS not in r.headers for r in rs):
        assert header(decision, EXPOSE_HEADERS) is None
    else:
        assert granted_set(decision, EXPOSE_HEADERS, HEADER_POOL) == responder_sets(
            rs, EXPOSE_HEADERS, HEADER_POOL
        )
    names = {name for name, _ in decision.headers}
    assert names <= {ALLOW_ORIGIN, ALLOW_CREDENTIALS, EXPOSE_HEADERS, VARY}


def summary(decision: Decision) -> object:
    """A decision with token spelling and order folded away (they follow node order)."""
    pools = {ALLOW_METHODS: METHOD_POOL, ALLOW_HEADERS: HEADER_POOL, EXPOSE_HEADERS: HEADER_POOL}
    return (
        decision.granted,
        {
            name: granted_set(decision, name, pools[name]) if name in pools else value
            for name, value in decision.headers
        },
    )


@given(MIXED.flatmap(lambda rs: st.tuples(st.just(rs), st.permutations(rs))))
def test_order_independent(pair: tuple[list[Reply], list[Reply]]) -> None:
    """Permuting the responders changes nothing but token spelling (and a denial's status)."""
    rs, permuted = pair
    for combine in (preflight, inventory_grant):
        a, b = combine(ORIGIN, rs), combine(ORIGIN, permuted)
        assert summary(a) == summary(b)
        if a.granted:
            assert a.status == b.status
            assert header(a, ALLOW_ORIGIN) == header(b, ALLOW_ORIGIN)
        else:
            assert a.headers == b.headers == ()


@given(MIXED)
def test_denial_status_is_the_first_non_granting_responder(rs: list[Reply]) -> None:
    decision = preflight(ORIGIN, rs)
    denials = [r for r in rs if not (200 <= r.status < 300 and origin_grants(r))]
    if denials:
        assert decision == Decision(denials[0].status, (), False)
    else:
        assert decision.granted and decision.status == 204
    inventory = inventory_grant(ORIGIN, rs)
    assert inventory.granted is all(origin_grants(r) for r in rs)


def origin_grants(r: Reply) -> bool:
    values = r.headers.get(ALLOW_ORIGIN, [])
    return len(values) == 1 and values[0].strip() in (b"*", ORIGIN)


@given(MIXED)
def test_repeated_or_folded_lines_read_the_same(rs: list[Reply]) -> None:
    """List headers folded onto one line answer as the same lines sent separately."""
    list_names = (ALLOW_METHODS, ALLOW_HEADERS, EXPOSE_HEADERS)
    folded = [
        Reply(
            r.status,
            {n: ([b", ".join(v)] if n in list_names else v) for n, v in r.headers.items()},
        )
        for r in rs
    ]
    for combine in (preflight, inventory_grant):
        assert summary(combine(ORIGIN, rs)) == summary(combine(ORIGIN, folded))
