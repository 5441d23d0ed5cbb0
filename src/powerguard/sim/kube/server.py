"""The simulated Kubernetes API server's HTTP side: discovery, get/list/watch, create, update,
patch (three types), delete, the ``/status`` and ``/eviction`` subresources, bearer-token users
with RBAC, server-side Tables for ``kubectl get``. JSON only (clients ask for protobuf only where
they also accept JSON)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from . import resources, tables
from .api import Api
from .errors import ApiError
from .rbac import User, forbidden, unauthorized
from .resources import Resource
from .selectors import fields, labels
from .store import Change, Store

log = logging.getLogger(__name__)
VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-powerguard-sim",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-12-05T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _json(body: Any, status: int = 200) -> web.Response:
    # exactly "application/json", as the API server sends it (clients compare the whole header)
    return web.Response(status=status, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def _flag(value: str | None) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (true, True, 1, t, ...)."""
    return (value or "").lower() in ("1", "t", "true")


def _error(exc: ApiError) -> web.Response:
    return _json(exc.status(), exc.code)


class ApiServer:
    def __init__(self, store: Store, users: dict[str, User], *, bookmark_s: float = 1.0) -> None:
        self.store, self.api, self.users, self.bookmark_s = store, Api(store), users, bookmark_s
        self.app = web.Application(client_max_size=16 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    # ------------------------------------------------------------ routing
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return _error(exc)
        except json.JSONDecodeError as exc:
            return _error(ApiError(400, "BadRequest", f"the request body is not JSON: {exc}"))

    def _user(self, request: web.Request) -> User:
        auth = request.headers.get("Authorization", "")
        user = self.users.get(auth[7:].strip()) if auth.startswith("Bearer ") else None
        if user is None:
            raise unauthorized()
        return user

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        user = self._user(request)
        if path == "/debug/compact" and request.method == "POST" and user.rules is None:
            ended = self.store.compact()  # the simulation's own control (an admin's): not the Kubernetes API
            return _json({"compacted": self.store.compacted, "watches_ended": ended})
        if path == "/version":
            return _json(VERSION)
        if path == "/api":
            return _json(resources.api_versions())
        if path == "/apis":
            return _json(resources.api_group_list())
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        elif parts[0] == "apis" and len(parts) == 2:
            g = next((x for x in resources.api_group_list()["groups"] if x["name"] == parts[1]), None)
            if g is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _json({"kind": "APIGroup", "apiVersion": "v1", **g})
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            doc = resources.resource_list(group, version)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _json(doc)
        ns = ""
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        res = resources.find(group, version, rest[0])
        if res is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in res.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if res.namespaced is False and ns:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self._verb(request, user, res, ns, name, sub)

    async def _verb(
        self, request: web.Request, user: User, res: Resource, ns: str, name: str, sub: str
    ) -> web.StreamResponse:
        q = request.query
        method = request.method
        dry_run = q.get("dryRun") == "All"
        if method == "GET":
            verb = "get" if name else ("watch" if _flag(q.get("watch")) else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "")
            if not verb or (verb != "create" and not name) or (verb == "create" and name and sub != "eviction"):
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource ({method})",
                )
        if not user.allowed(verb, res, sub):
            raise forbidden(user, verb, res, sub, ns, name)
        accept = request.headers.get("Accept", "")
        if verb == "get":
            obj = self.store.get(res, ns, name)
            if tables.wants_table(accept):
                return _json(tables.table(res, [obj], rv=obj["metadata"]["resourceVersion"], now=self.store.clock()))
            return _json(obj)
        if verb in ("list", "watch"):
            match_l, match_f = labels(q.get("labelSelector")), fields(q.get("fieldSelector"), res.plural)

            def match(o: dict) -> bool:
                return match_l(o) and match_f(o)

            if verb == "watch":
                return await self._watch(request, res, ns or None, match, accept)
            items = self.store.list(res, ns or None, match)
            rv = str(self.store.rv)
            if tables.wants_table(accept):
                return _json(tables.table(res, items, rv=rv, now=self.store.clock()))
            return _json(
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                }
            )
        body = await request.json() if request.can_read_body else None
        who = user.name
        if verb == "create" and sub == "eviction":
            return _json(self.api.evict(who, ns, name, body or {}, dry_run=dry_run), 201)
        if verb == "create":
            return _json(self.api.create(who, res, ns, body, dry_run=dry_run), 201)
        if verb == "update":
            return _json(self.api.update(who, res, ns, name, body or {}, sub=sub, dry_run=dry_run))
        if verb == "patch":
            kind = request.headers.get("Content-Type", "").split(";")[0].strip()
            return _json(self.api.patch(who, res, ns, name, kind, body, sub=sub, dry_run=dry_run))
        grace = q.get("gracePeriodSeconds")
        if grace is None and isinstance(body, dict):
            grace = body.get("gracePeriodSeconds")
        return _json(
            self.api.delete(who, res, ns, name, grace_s=None if grace is None else int(grace), dry_run=dry_run)
        )

    # ------------------------------------------------------------ watch
    async def _watch(
        self, request: web.Request, res: Resource, ns: str | None, match, accept: str
    ) -> web.StreamResponse:
        q = request.query
        as_table = tables.wants_table(accept)
        bookmarks = _flag(q.get("allowWatchBookmarks"))
        timeout = float(q.get("timeoutSeconds") or 1800)
        rv_param = q.get("resourceVersion", "")
        queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self.store.watchers.add(queue)
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await resp.prepare(request)

        async def send(type_: str, obj: dict) -> None:
            if as_table and type_ in ("ADDED", "MODIFIED", "DELETED"):
                obj = tables.table(res, [obj], rv=obj["metadata"]["resourceVersion"], now=self.store.clock())
            await resp.write((json.dumps({"type": type_, "object": obj}) + "\n").encode())

        def wanted(c: Change) -> bool:
            return c.resource is res and (ns is None or c.obj["metadata"].get("namespace") == ns) and match(c.obj)

        try:
            if _flag(q.get("sendInitialEvents")):  # a watch-list: the state, its end marked, then changes
                last = self.store.rv
                for obj in self.store.list(res, ns, match):
                    await send("ADDED", obj)
                await send(
                    "BOOKMARK",
                    {
                        "kind": res.kind,
                        "apiVersion": res.api_version,
                        "metadata": {
                            "resourceVersion": str(last),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                )
            elif rv_param in ("", "0"):
                last = self.store.rv
                for obj in self.store.list(res, ns, match):
                    await send("ADDED", obj)
            else:
                try:
                    backlog = self.store.since(int(rv_param))
                except ApiError as exc:  # 410 Gone arrives as an ERROR event, as from the real server
                    await send("ERROR", exc.status())
                    return resp
                last = int(rv_param)
                for c in backlog:
                    if wanted(c):
                        await send(c.type, c.obj)
                    last = c.rv
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while (left := end - loop.time()) > 0:
                try:
                    c = await asyncio.wait_for(queue.get(), min(left, self.bookmark_s))
                except TimeoutError:
                    if bookmarks:
                        mark = {
                            "kind": res.kind,
                            "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)},
                        }
                        await send("BOOKMARK", mark)
                    continue
                if c is None:  # compacted: the watch ends; its client resumes and gets 410
                    return resp
                if c.rv <= last:
                    continue
                last = c.rv
                if wanted(c):
                    await send(c.type, c.obj)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(queue)
        return resp
