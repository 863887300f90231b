"""The tests of llama.cpp's server suite whose outcome differs through the proxy, each with why
(docs/engine-suite.md#what-differs).

Keys are test ids, or a prefix ending in ``[`` (every parameter of a test) or ``::``. A cause
starting ``design:`` is the proxy doing what its docs say; one starting ``bug:`` (``BUG`` in
``compare.py``) is a bug found, and fails the target until it is fixed.
"""

from __future__ import annotations

_PREFLIGHT = (
    "design: a preflight is answered by the proxy from every node's grant, 204 "
    "(docs/browser-policy.md#preflight-intersection); llama-server answers 200"
)

DOCUMENTED: dict[str, str] = {
    "unit/test_security.py::test_cors_options[": _PREFLIGHT,
    "unit/test_security.py::test_cors_origins_localhost_reflects[": _PREFLIGHT,
    "unit/test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": _PREFLIGHT,
    "unit/test_security.py::test_incorrect_api_key[": (
        "design: a missing or wrong key is the proxy's own 401 unauthorized "
        "(docs/lan.md#a-shared-machine), whose error type is nvpair_proxy "
        "(docs/request-path.md#proxy-generated-answers), not llama-server's authentication_error"
    ),
    "unit/test_basic.py::test_server_multiple_addresses": (
        "design: a facade listens on one --bind address (docs/ports.md#per-engine-ports); "
        "the test asks one server on both 127.0.0.1 and ::1, the harness binds the first"
    ),
    "unit/test_sleep.py::test_server_sleep_metrics_buckets": (
        "design: fleet-mode polls read a --metrics server's busy slots from /metrics, the one "
        "route that neither wakes it nor keeps it awake (docs/fleet-scheduling.md"
        "#sleeping-servers); each read restarts llama-server's throughput window, so the "
        "test's first scrape after a poll finds it empty"
    ),
    "unit/test_security.py::test_access_public_endpoint[": (
        "design: where keys apply every facade caller presents one, on every route, /health "
        "included (docs/lan.md#a-shared-machine); llama-server --api-key leaves /health public. "
        "A keyless check asks the admin listener's /healthz (docs/operations.md#is-it-healthy)"
    ),
}
