"""Node credentials: a fleet file's ``[nodes.credentials]``, read from where each value says
(docs/fleet-scheduling.md#node-credentials).

An engine that requires a key (``llama-server --api-key``, LM Studio's authentication) is sent
``Authorization: Bearer <secret>`` on every request this process makes to it. The file names
only where the secret is — ``env:NAME``, ``file:PATH`` or systemd's ``credential:NAME`` — never
the secret itself, so the file can be shown, copied and kept in version control. The
environment and the fleet file's directory are handed in; no message built here ever holds a
secret or anything that might be one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from attrs import field, frozen

#: How each kind of value starts; what follows names the variable, the file or the credential.
ENV = "env:"
FILE = "file:"
CREDENTIAL = "credential:"

#: Where systemd puts the files of ``LoadCredential=`` (systemd.exec(5), "Credentials").
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: A systemd credential's name: a file name in its directory, never a path out of it.
_CREDENTIAL_NAME = re.compile(r"[A-Za-z0-9_.@-]+")

#: A secret is a line of text: more than this is not a key file but a mistake.
_MAX_SECRET = 64 * 1024

#: A bearer token is visible ASCII (RFC 6750's token68 is narrower; engines' keys are free
#: text): nothing that could end the header line or hide in it.
_TOKEN = re.compile(rb"[\x21-\x7e]+")

#: What a value of no known kind is told. It never repeats the value: a secret pasted into the
#: file must not reach the log as well.
_SHAPE = (
    'must be "env:NAME", "file:PATH" or "credential:NAME", where the secret is '
    "(the secret itself never goes in the file)"
)


class SourceError(ValueError):
    """A ``file:`` or ``credential:`` value that cannot be read; says which, never content."""


@frozen
class Credential:
    """One engine's credential on one node.

    :ivar source: where it was read, as the fleet file says it (``env:GPU1_KEY``): shown,
        and compared between nodes, never the value.
    :ivar authorization: the ``Authorization`` value sent to the engine. Left out of the
        repr, so no log line or traceback that shows a fleet shows the secret.
    """

    source: str
    authorization: bytes = field(repr=False)


def credential_path(name: str, environ: Mapping[str, str]) -> Path:
    """The file of systemd credential ``name``: ``$CREDENTIALS_DIRECTORY/name``.

    :raises SourceError: the name is not a plain file name, or no directory is set (the
        process was not started by a unit with ``LoadCredential=``).
    """
    if _CREDENTIAL_NAME.fullmatch(name) is None or name in {".", ".."}:
        raise SourceError(f"credential {name!r} is not a file name")
    directory = environ.get(CREDENTIALS_DIRECTORY)
    if not directory:
        raise SourceError(
            f"credential {name}: {CREDENTIALS_DIRECTORY} is not set "
            f"(the unit needs LoadCredential={name}:/etc/nvpair/{name})"
        )
    return Path(directory) / name


def read_source(what: str, path: Path) -> bytes:
    """A secret's file, whole; :class:`SourceError` names ``what`` and why, not the content."""
    try:
        with path.open("rb") as stream:
            data = stream.read(_MAX_SECRET + 1)
    except OSError as error:
        raise SourceError(f"{what}: cannot read {path}: {error.strerror}") from None
    if len(data) > _MAX_SECRET:
        raise SourceError(f"{what}: {path} is over {_MAX_SECRET} bytes")
    return data


def _secret(value: str, environ: Mapping[str, str], fleet_dir: Path) -> tuple[str, bytes]:
    """What ``value`` names, and the secret's bytes as found there."""
    if value.startswith(ENV):
        variable = value[len(ENV) :]
        if _VARIABLE.fullmatch(variable) is None:
            raise ValueError(f"{_SHAPE}: NAME is letters, digits and _, not starting with a digit")
        what = f"environment variable {variable}"
        secret = environ.get(variable)
        if secret is None:
            raise ValueError(f"{what} is not set")
        return what, secret.encode("utf-8", "surrogateescape")
    if value.startswith(FILE):
        text = value[len(FILE) :]
        if not text.strip():
            raise ValueError(f"{_SHAPE}: PATH is empty")
        # One trailing newline dropped: `echo KEY > file` writes one.
        return f"file {text}", read_source(f"file {text}", fleet_dir / text).removesuffix(b"\n")
    if value.startswith(CREDENTIAL):
        name = value[len(CREDENTIAL) :]
        data = read_source(f"credential {name}", credential_path(name, environ))
        return f"credential {name}", data.removesuffix(b"\n")
    raise ValueError(_SHAPE)


def read_credential(
    value: object, environ: Mapping[str, str], fleet_dir: Path = Path()
) -> Credential:
    """The credential a value names, read now: ``env:NAME`` from ``environ``, ``file:PATH``
    relative to ``fleet_dir`` (the fleet file's directory), ``credential:NAME`` from
    ``environ``'s ``$CREDENTIALS_DIRECTORY``; a file's one trailing newline is dropped.

    :raises ValueError: saying what is wrong — no known kind, not readable, empty, or holding
        what a header cannot carry — and naming where, never the content.
    """
    if not isinstance(value, str):
        raise ValueError(_SHAPE)
    what, raw = _secret(value, environ, fleet_dir)
    if not raw:
        raise ValueError(f"{what} is empty")
    if _TOKEN.fullmatch(raw) is None:
        raise ValueError(
            f"{what} holds what a bearer token cannot (spaces, control or non-ASCII characters)"
        )
    return Credential(value, b"Bearer " + raw)
