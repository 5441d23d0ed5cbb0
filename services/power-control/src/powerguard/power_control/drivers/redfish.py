"""Redfish BMCs: ``ComputerSystem.Reset`` and ``PowerState`` read-back over HTTPS (aiohttp).

TLS is verified by default, against the system's CAs or a configured CA bundle; an
unverified certificate is an error unless the site explicitly allows it (``verify_tls: false``).
Basic auth (every BMC supports it; sessions would add a login round trip per action).
"""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp

from ..errors import AuthenticationFailed, CommandRejected, DeviceUnreachable, PowerControlError, TlsUntrusted
from .base import Guarded, PowerDriver, PowerState, RestorePolicy

_RESET = {"on": "On", "soft_off": "GracefulShutdown", "off": "ForceOff", "cycle": "ForceRestart"}
_POLICY_TO_REDFISH: dict[RestorePolicy, str] = {
    "always-on": "AlwaysOn",
    "previous": "LastState",
    "always-off": "AlwaysOff",
}
_POLICY_FROM_REDFISH = {v: k for k, v in _POLICY_TO_REDFISH.items()}


def tls_context(*, verify: bool, ca_bundle: str | None) -> ssl.SSLContext | bool:
    if not verify:
        return False
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise PowerControlError(f"cannot load CA bundle {ca_bundle}: {exc}") from None


class RedfishDriver(PowerDriver):
    kind = "redfish"

    def __init__(
        self,
        device: str,
        guard: Guarded,
        *,
        base_url: str,
        user: str,
        password: str,
        system_id: str | None = None,
        verify_tls: bool = True,
        ca_bundle: str | None = None,
    ) -> None:
        super().__init__(device, guard)
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": aiohttp.encode_basic_auth(user, password)}
        self._ssl = tls_context(verify=verify_tls, ca_bundle=ca_bundle)
        self._system_id = system_id
        self._system_path: str | None = None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"RedfishDriver({self.device} {self.base_url})"

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._ssl, limit=4)
            )
        return self._session

    async def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        url = self.base_url + path
        try:
            async with self._http().request(method, url, json=body) as rsp:
                text = await rsp.text()
                if rsp.status == 401:
                    raise AuthenticationFailed(f"{self.device}: Redfish service refused the credentials (401)")
                if rsp.status == 403:
                    raise AuthenticationFailed(f"{self.device}: account lacks the privilege for {method} {path} (403)")
                if rsp.status >= 400:
                    raise CommandRejected(f"{self.device}: {method} {path} answered {rsp.status}: {_message(text)}")
                return await rsp.json(content_type=None) if text.strip() else {}
        except aiohttp.ClientConnectorCertificateError as exc:
            raise TlsUntrusted(
                f"{self.device}: TLS certificate of {self.base_url} does not verify ({exc.certificate_error}); "
                "set options.ca_bundle to the BMC's CA, or verify_tls: false for a lab BMC"
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise TlsUntrusted(f"{self.device}: TLS handshake with {self.base_url} failed: {exc}") from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise DeviceUnreachable(f"{self.device}: cannot reach {self.base_url}: {exc}") from None

    async def _system(self) -> str:
        if self._system_path is None:
            members = (await self._request("GET", "/redfish/v1/Systems")).get("Members", [])
            paths = [m["@odata.id"] for m in members if "@odata.id" in m]
            if self._system_id is not None:
                paths = [p for p in paths if p.rstrip("/").rsplit("/", 1)[-1] == self._system_id]
            if len(paths) != 1:
                which = f"system {self._system_id!r}" if self._system_id else "exactly one system"
                raise CommandRejected(f"{self.device}: expected {which} under /redfish/v1/Systems, found {len(paths)}")
            self._system_path = paths[0]
        return self._system_path

    async def _get_system(self) -> dict:
        return await self.guard.call("GET system", lambda: self._get_system_raw())

    async def _get_system_raw(self) -> dict:
        return await self._request("GET", await self._system())

    async def status(self) -> PowerState:
        state = (await self._get_system()).get("PowerState")
        return {"On": "on", "Off": "off", "PoweringOff": "on", "PoweringOn": "off"}.get(state, "unknown")

    async def _reset(self, action: str) -> None:
        async def go() -> None:
            path = await self._system()
            await self._request("POST", f"{path}/Actions/ComputerSystem.Reset", {"ResetType": _RESET[action]})

        await self.guard.call(f"Reset {_RESET[action]}", go)

    async def on(self) -> None:
        await self._reset("on")

    async def soft_off(self) -> None:
        await self._reset("soft_off")

    async def off(self) -> None:
        await self._reset("off")

    async def cycle(self) -> None:
        await self._reset("cycle")

    async def restore_policy(self) -> RestorePolicy | None:
        return _POLICY_FROM_REDFISH.get((await self._get_system()).get("PowerRestorePolicy"))

    async def set_restore_policy(self, policy: RestorePolicy) -> None:
        async def go() -> None:
            await self._request("PATCH", await self._system(), {"PowerRestorePolicy": _POLICY_TO_REDFISH[policy]})

        await self.guard.call("PATCH PowerRestorePolicy", go)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _message(text: str) -> str:
    """The Redfish extended error message when there is one, else the start of the body."""
    import json

    try:
        err = json.loads(text).get("error", {})
        info = err.get("@Message.ExtendedInfo") or [{}]
        return info[0].get("Message") or err.get("message") or text[:200]
    except (ValueError, AttributeError):
        return text[:200]
