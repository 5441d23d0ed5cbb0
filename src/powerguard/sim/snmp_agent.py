"""A small in-process SNMP agent (pysnmp 7, asyncio) serving live values, for the simulated
site: ``get`` callables give each object's current value, ``set`` callables accept writes.

    agent = SnmpAgent(community="public", write_community="private")
    agent.scalar("1.3.6.1.2.1.33.1.4.1.0", Integer32, lambda: 5 if ups.on_battery else 3)
    agent.scalar("1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.1", Integer32, get, set=on_write)
    port = await agent.start("127.0.0.1", 0)

pysnmp quirks handled here: the transport's bind is awaited (a taken port must
fail loudly); the read-only community gets a dummy write view, else it could SET
(lextudio/pysnmp#48); instance hooks are synchronous, so setters must not block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config, engine
from pysnmp.entity.rfc3413 import cmdrsp, context
from pysnmp.proto import rfc1902
from pysnmp.smi import error as smi_error

Getter = Callable[[], Any]
Setter = Callable[[int, bool], bool]  # (value, dry) -> acceptable; applies it when not dry


def _oid(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip(".").split("."))


class SnmpAgent:
    def __init__(self, *, community: str = "public", write_community: str | None = None) -> None:
        self.community = community
        self.write_community = write_community
        self._objects: list[tuple[tuple[int, ...], type, Getter, Setter | None]] = []
        self.engine: engine.SnmpEngine | None = None
        self._transport: Any = None
        self.port: int | None = None

    def scalar(self, oid: str, syntax: type, get: Getter, *, set: Setter | None = None) -> None:
        self._objects.append((_oid(oid), syntax, get, set))

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        eng = engine.SnmpEngine()
        transport = udp.UdpAsyncioTransport().open_server_mode((host, port))
        sock_transport, _ = await transport._lport
        self.port = sock_transport.get_extra_info("sockname")[1]
        self._transport = transport
        config.add_transport(eng, udp.DOMAIN_NAME, transport)
        config.add_v1_system(eng, "pg-ro", self.community)
        # read view everywhere; the write view points at an OID nothing lives under (pysnmp#48)
        config.add_vacm_user(eng, 2, "pg-ro", "noAuthNoPriv", (1, 3, 6), (1, 3, 6, 1, 6, 3, 99999))
        if self.write_community:
            config.add_v1_system(eng, "pg-rw", self.write_community)
            config.add_vacm_user(eng, 2, "pg-rw", "noAuthNoPriv", (1, 3, 6), (1, 3, 6))
        ctx = context.SnmpContext(eng)
        builder = ctx.get_mib_instrum().get_mib_builder()
        (mib_scalar, mib_instance) = builder.import_symbols("SNMPv2-SMI", "MibScalar", "MibScalarInstance")
        symbols = {}
        for i, (oid, syntax, get, setter) in enumerate(self._objects):
            parent, inst = oid[:-1], oid[-1:]
            access = "read-write" if setter else "read-only"
            symbols[f"pgObj{i}"] = mib_scalar(parent, syntax()).setMaxAccess(access)
            symbols[f"pgInst{i}"] = _instance_class(mib_instance, get, setter)(parent, inst, syntax(_initial(syntax)))
        builder.export_symbols("__POWERGUARD_SIM_MIB", **symbols)
        cmdrsp.GetCommandResponder(eng, ctx)
        cmdrsp.NextCommandResponder(eng, ctx)
        cmdrsp.BulkCommandResponder(eng, ctx)
        cmdrsp.SetCommandResponder(eng, ctx)
        eng.transport_dispatcher.job_started(1)
        self.engine = eng
        return self.port

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.transport_dispatcher.job_finished(1)
            self.engine.close_dispatcher()
            self.engine = None


def _initial(syntax: type) -> Any:
    return "" if issubclass(syntax, rfc1902.OctetString) else (1, 3) if issubclass(syntax, rfc1902.ObjectName) else 0


def _instance_class(base: type, get: Getter, setter: Setter | None) -> type:
    class Instance(base):  # pysnmp 7.1 instance hooks are still camelCase and synchronous
        def getValue(self, name, **ctx):
            return self.getSyntax().clone(get())

        def writeTest(self, varBind, **ctx):
            name, value = varBind
            if setter is None:
                raise smi_error.NotWritableError(name=name, idx=ctx.get("idx"))
            if value.tagSet != self.getSyntax().tagSet:
                raise smi_error.WrongTypeError(name=name, idx=ctx.get("idx"))
            if not setter(int(value), True):
                raise smi_error.WrongValueError(name=name, idx=ctx.get("idx"))
            super().writeTest(varBind, **ctx)

        def writeCommit(self, varBind, **ctx):
            super().writeCommit(varBind, **ctx)
            assert setter is not None
            setter(int(varBind[1]), False)

    return Instance


async def _selftest() -> None:  # pragma: no cover - manual check
    state = {"x": 1}
    agent = SnmpAgent(write_community="private")
    agent.scalar("1.3.6.1.2.1.33.1.4.1.0", rfc1902.Integer32, lambda: 3)
    agent.scalar(
        "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.1",
        rfc1902.Integer32,
        lambda: state["x"],
        set=lambda v, dry: v in (1, 2, 3) and (dry or not state.update(x=v)),
    )
    port = await agent.start()
    print("port", port, flush=True)
    await asyncio.sleep(30)


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(_selftest())
