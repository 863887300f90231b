"""The tests of llama.cpp's server suite whose outcome differs through the proxy by design,
each with why (docs/engine-suite.md#the-differences-by-design).

Keys are test ids, or a prefix ending in ``[`` (every parameter of a test) or ``::``.
"""

from __future__ import annotations

DOCUMENTED: dict[str, str] = {}
