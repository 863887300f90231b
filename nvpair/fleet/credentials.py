"""Node credentials: a fleet file's ``[nodes.credentials]``, read from the environment
(docs/fleet-scheduling.md#node-credentials).

An engine that requires a key (``llama-server --api-key``, LM Studio's authentication) is sent
``Authorization: Bearer <secret>`` on every request this process makes to it. The file names
only where the secret is, ``env:NAME``, never the secret itself, so the file can be shown,
copied and kept in version control. Pure: the environment is a mapping handed in, and no
message built here ever holds a secret or anything that might be one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from attrs import field, frozen

#: How a credential's value starts: what follows names the environment variable.
ENV = "env:"

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: A bearer token is visible ASCII (RFC 6750's token68 is narrower; engines' keys are free
#: text): nothing that could end the header line or hide in it.
_TOKEN = re.compile(rb"[\x21-\x7e]+")

#: What a value that is not ``env:NAME`` is told. It never repeats the value: a secret pasted
#: into the file must not reach the log as well.
_SHAPE = (
    'must be "env:NAME", the environment variable that holds the secret '
    "(the secret itself never goes in the file)"
)


@frozen
class Credential:
    """One engine's credential on one node.

    :ivar variable: the environment variable it was read from (shown, never the value).
    :ivar authorization: the ``Authorization`` value sent to the engine. Left out of the
        repr, so no log line or traceback that shows a fleet shows the secret.
    """

    variable: str
    authorization: bytes = field(repr=False)


def read_credential(value: object, environ: Mapping[str, str]) -> Credential:
    """The credential an ``env:NAME`` value names, read from ``environ`` now.

    :raises ValueError: saying what is wrong — not ``env:NAME``, the variable not set, empty,
        or holding what a header cannot carry — and naming the variable, never its value.
    """
    if not isinstance(value, str) or not value.startswith(ENV):
        raise ValueError(_SHAPE)
    variable = value[len(ENV) :]
    if _VARIABLE.fullmatch(variable) is None:
        raise ValueError(f"{_SHAPE}: NAME is letters, digits and _, not starting with a digit")
    secret = environ.get(variable)
    if secret is None:
        raise ValueError(f"environment variable {variable} is not set")
    if not secret:
        raise ValueError(f"environment variable {variable} is empty")
    raw = secret.encode("utf-8", "surrogateescape")
    if _TOKEN.fullmatch(raw) is None:
        raise ValueError(
            f"environment variable {variable} holds what a bearer token cannot "
            "(spaces, control or non-ASCII characters)"
        )
    return Credential(variable, b"Bearer " + raw)
