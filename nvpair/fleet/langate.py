"""A fleet's ``[access]`` as it is now: who besides loopback may call, asked by every facade
(docs/lan.md#who-may-call).

One per fleet process. SIGHUP hands it a re-read ``[access]`` (:meth:`LanGate.reload`); every
request is judged against the one in force when its head arrives, and its key is looked up
again when it is admitted, so a key removed in between is refused rather than served. Failed
keys are counted per address (:mod:`nvpair.fleet.throttle`). The TLS context for LAN callers is
built here from the checked certificate, and rebuilt when a reload changes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import evolve
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.logger import Logger

from nvpair.common.reasons import Reason
from nvpair.engines.admission import is_loopback, parse_ip
from nvpair.engines.caller import Caller
from nvpair.fleet.adminconfig import AdminLan
from nvpair.fleet.adminpolicy import AdminVerdict, judge_admin
from nvpair.fleet.lanconfig import Access, LanTls
from nvpair.fleet.lanpolicy import (
    IPAddress,
    Verdict,
    caller_of,
    judge,
    keyed_loopback_caller,
    loopback_caller,
)
from nvpair.fleet.throttle import FailedKeys
from nvpair.wire.message import Fields
from nvpair.wire.server.site import Refusal
from nvpair.wire.trust.connbounds import source_of

if TYPE_CHECKING:
    from OpenSSL import SSL

#: Without ``[access]``: the answer every non-loopback caller gets, exactly as in broker mode.
LOOPBACK_ONLY = Refusal(Reason.FORBIDDEN)
NOT_LISTED = Refusal(Reason.FORBIDDEN, "this address is in none of the fleet's [access] networks")
TLS_REQUIRED = Refusal(Reason.TLS_REQUIRED)
UNAUTHORIZED = Refusal(
    Reason.UNAUTHORIZED, headers=((b"WWW-Authenticate", b'Bearer realm="nvpair"'),)
)
#: The admin listener's: Basic, so that a browser prompts for the key (its password).
ADMIN_UNAUTHORIZED = Refusal(
    Reason.UNAUTHORIZED,
    "a key with admin = true is required: Authorization: Bearer <key>, or as Basic's password",
    headers=((b"WWW-Authenticate", b'Basic realm="nvpair"'),),
)
ADMIN_CLOSED = Refusal(Reason.FORBIDDEN, "the admin listener serves loopback callers only")
ADMIN_NOT_LISTED = Refusal(
    Reason.FORBIDDEN, "this address is in none of the fleet's [access] networks"
)


def _throttled(seconds: int) -> Refusal:
    return Refusal(Reason.TOO_MANY_AUTH_FAILURES, headers=((b"Retry-After", b"%d" % seconds),))


def _key_fields(fields: Fields) -> tuple[Sequence[bytes] | None, Sequence[bytes] | None]:
    """The fields a facade caller's key may come in: ``Authorization``, and ``X-Api-Key`` for
    Anthropic clients (docs/lan.md#x-api-key). The admin listener reads the first only."""
    return fields.get(b"Authorization"), fields.get(b"X-Api-Key")


def _ip(peer: IAddress | None) -> IPAddress | None:
    host = getattr(peer, "host", None)
    return parse_ip(host) if isinstance(host, str) else None


class LanGate:
    """The ``[access]`` in force and the failed-key throttle.

    :param access: the fleet file's ``[access]``; None lets no LAN caller in and changes
        nothing for loopback callers.
    """

    log = Logger()

    def __init__(
        self, clock: IReactorTime, access: Access | None, admin: AdminLan | None = None
    ) -> None:
        self.access: Access | None = None
        #: ``[admin]`` in force: while None, LAN callers of the admin listener are refused.
        self.admin: AdminLan | None = None
        self.tls: SSL.Context | None = None
        self._tls_from: LanTls | None = None
        # Counted per IPv4 address and per IPv6 /64 (docs/lan.md#failed-keys).
        self._failed: FailedKeys[str] = FailedKeys(clock)
        self.reload(access, admin)

    def reload(self, access: Access | None, admin: AdminLan | None = None) -> None:
        """Put a re-read ``[access]`` and ``[admin]`` in force; requests already admitted keep
        their key. A changed ``admin.bind`` is the listener's, bound at start: only whether
        its LAN callers are let in changes here (docs/lan.md#the-admin-view-from-the-lan)."""
        if self.admin is not None and admin is None:
            self.log.warn("[admin] removed: the admin listener refuses LAN callers from now on")
        self.admin = admin
        wanted = access.tls if access is not None else None
        if wanted != self._tls_from:
            self.tls, self._tls_from = self._context(wanted), wanted
            if wanted is not None and self.tls is None:
                access = None if access is None else _without_tls(access)
        before, self.access = self.access, access
        if access is None:
            if before is not None:
                self.log.info("LAN callers: none any more (no [access] networks)")
            return
        self.log.info(
            "LAN callers from {networks}: {keys}, {tls}",
            networks=", ".join(str(network) for network in access.networks),
            keys="no key needed"
            if access.keys is None
            else f"a key needed ({len(access.keys)} in the key file)",
            tls="TLS too" if self.tls is not None else "plaintext only",
        )
        if access.loopback_keys:
            self.log.info("loopback callers: a key needed too (access.loopback-keys)")

    def shown(self) -> dict[str, object] | None:
        """The ``[access]`` in force as ``/status`` shows it for every facade: who besides
        loopback is admitted (docs/lan.md#who-may-call); None: nobody."""
        access = self.access
        if access is None:
            return None
        return {
            "networks": [str(network) for network in access.networks],
            "keys": access.keys is not None,
            "tls": self.tls is not None,
            "tlsRequired": access.require_tls and self.tls is not None,
        }

    def _context(self, tls: LanTls | None) -> SSL.Context | None:
        if tls is None:
            return None
        try:
            from nvpair.wire.trust.lantls import lan_context

            return lan_context(tls.cert_pem, tls.key_pem)
        except ImportError:
            # The process started without TLS and keeps pyOpenSSL out (docs/performance.md#memory).
            self.log.warn("access.tls-cert: TLS for LAN callers needs a restart to start")
        return None

    def refusal(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False, tls: bool = False
    ) -> Refusal | None:
        """A caller's refusal at its request head, or None to read on; a loopback caller is
        judged only where ``loopback-keys`` asks it for a key (docs/lan.md#a-shared-machine),
        as a LAN caller's key is: 401, and the same throttle.

        :param preflight: a CORS preflight, which needs no key (:func:`judge`).
        :param tls: the request came over TLS."""
        access = self.access
        ip = _ip(peer)
        authorization, x_api_key = _key_fields(fields)
        if is_loopback(peer):
            if access is None or not access.loopback_keys:
                return None
            verdict, _ = judge(
                access, ip, authorization, preflight, loopback=True, x_api_key=x_api_key
            )
        else:
            if access is None:
                return LOOPBACK_ONLY
            verdict, _ = judge(access, ip, authorization, preflight, x_api_key=x_api_key)
            if verdict is Verdict.FORBIDDEN:
                return NOT_LISTED
            if not tls and access.require_tls and self.tls is not None:
                # Before the throttle and the key: a key sent in clear is neither judged nor
                # counted as failed (docs/lan.md#tls).
                return TLS_REQUIRED
        assert ip is not None
        throttled = self._throttled(ip)
        if throttled is not None:
            return throttled
        if verdict is Verdict.ALLOWED:
            return None
        if verdict is Verdict.BAD_KEY:
            self._key_failed(ip)
        return UNAUTHORIZED

    def _throttled(self, ip: IPAddress) -> Refusal | None:
        # A host may use any address of its IPv6 /64: one caller (docs/lan.md#failed-keys).
        wait = self._failed.retry_after(source_of(str(ip)) or str(ip))
        return None if wait is None else _throttled(wait)

    def _key_failed(self, ip: IPAddress) -> None:
        block = source_of(str(ip)) or str(ip)
        self._failed.failed(block)
        if self._failed.retry_after(block) is not None:
            self.log.warn(
                "{address} presented too many failed keys: refused for a while",
                address=str(block),
            )

    def admin_refusal(
        self, peer: IAddress | None, method: bytes, path: bytes, fields: Fields, tls: bool
    ) -> Refusal | None:
        """A request to the admin listener: its refusal, or None to serve it. Loopback callers
        are served as ever; the facades' failed-key throttle counts here too, so the admin
        listener is no second place to guess keys (docs/lan.md#the-admin-view-from-the-lan).

        :param tls: the request came over TLS."""
        if is_loopback(peer):
            return None
        ip = _ip(peer)
        verdict, key = judge_admin(
            self.access if self.admin is not None else None,
            ip,
            tls_served=self.tls is not None,
            over_tls=tls,
            method=method,
            path=path,
            authorization=fields.get(b"Authorization"),
        )
        if verdict is AdminVerdict.FORBIDDEN:
            return ADMIN_CLOSED if self.admin is None or self.access is None else ADMIN_NOT_LISTED
        if verdict is AdminVerdict.TLS_REQUIRED:
            return TLS_REQUIRED
        if verdict is AdminVerdict.SERVE and key is None:
            return None  # an open route (/healthz): no key asked, none to throttle
        assert ip is not None
        throttled = self._throttled(ip)
        if throttled is not None:
            return throttled  # a valid key or not, as on the facades
        if verdict is AdminVerdict.SERVE:
            return None
        if verdict is AdminVerdict.BAD_KEY:
            self._key_failed(ip)
        return ADMIN_UNAUTHORIZED

    def caller(
        self, peer: IAddress | None, fields: Fields, preflight: bool = False
    ) -> Caller | Refusal | None:
        """Who an admitted request came from (None: no ``[access]`` in force), or its
        refusal when the ``[access]`` reloaded since its head no longer lets it in."""
        access = self.access
        if access is None:
            return None if is_loopback(peer) else LOOPBACK_ONLY
        authorization, x_api_key = _key_fields(fields)
        loopback = is_loopback(peer)
        if loopback and not access.loopback_keys:
            return loopback_caller(access, authorization, x_api_key)
        verdict, key = judge(access, _ip(peer), authorization, preflight, loopback, x_api_key)
        if verdict is Verdict.ALLOWED:
            return keyed_loopback_caller(key) if loopback else caller_of(key)
        return NOT_LISTED if verdict is Verdict.FORBIDDEN else UNAUTHORIZED


def _without_tls(access: Access) -> Access:
    # No TLS to serve: none can be required either.
    return evolve(access, tls=None, require_tls=False)
