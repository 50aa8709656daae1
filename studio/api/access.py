"""Who may do what (docs/SECURITY.md): the owner's key, the public page's limits, and the cross-site rule.

    access = Access(api_key, public_page=False)
    access.bearer_ok(request.headers.get("authorization"))   # /v1 routes and MCP tools
    access.launch_kwargs()                                   # Gradio's login, when the page needs one
    access.bearer_login(app)                                 # ... which the key passes too (in the lifespan)
    @access.owner_only                                       # a page handler that changes the shared library
    access.page_caller(gr_request)                           # whose take a page event's is: its limits and turn
    access.cross_site_refusal(origin, host)                  # a keyless server refuses other sites' writes
    host_guard(bind_host, api_key, allowed_hosts, share)     # a keyless local server answers local names only
    friendly_queue_full(demo)                                # a full queue answers with a sentence

Every limit of a public studio, with its flag, is listed in docs/SPACES.md ("Limits"); a visitor's take is held
to them by studio/takes/limits.py, whatever door it came by.

Without a key (the local default) whoever can reach the studio is its owner. With a key, the owner is whoever
shows it: as `Authorization: Bearer <key>` on any request (HTTP API, MCP, `gradio_client`, the file URLs they are
handed, scripts), or as the password of the page's login.
The page's events are checked here, on the server, because Gradio's queue runs any event by its `fn_index`
whatever the page shows.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import json
import os
import typing
from collections.abc import Mapping
from urllib.parse import urlsplit

import fastapi
import gradio as gr

from studio.takes.admission import OWNER, Caller
from studio.takes.limits import PUBLIC_MAX_TEXT_CHARS

QUEUE_FULL = ("The studio is busy: {size} requests are already waiting for the GPU. Try again in a minute.")
OWNER_ONLY = ("Only the studio's owner can see the voice library's details, change or export it, and save style "
              "presets. Log in with the studio's key, or use the HTTP API with `Authorization: Bearer <key>`.")
OWNER_ONLY_LONG = ("Long texts and scripts are for the studio's owner: on the public page a take is up to "
                   f"{PUBLIC_MAX_TEXT_CHARS} characters (use the Studio tab). Log in with the studio's key, or send "
                   "long input to /v1/audio/speech with `Authorization: Bearer <key>`.")
GRADIO_USER = "get_current_user"  # the dependency by which Gradio's routes (gradio/routes.py) ask who is logged in
OWNER_LOGIN = "owner"  # the user name Gradio's routes see for a request that carries the key
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
SHARE_DOMAIN = ".gradio.live"  # where `--share` links point
WRONG_HOST = ("This studio has no API key and answers only to local addresses, not to {host!r}: a page that renames "
              "its own site to point at your machine (DNS rebinding) must not reach your voices. Open it as "
              "http://localhost:<port>, or start it with --allowed-hosts {host} (HIGGS_ALLOWED_HOSTS) if that name "
              "is yours, or set --api-key.")


class Access:
    """The studio's access rule, shared by the page, the HTTP API and the MCP tools."""

    def __init__(self, api_key: str | None = None, *, public_page: bool = False):
        self.api_key = api_key or None
        self.public_page = public_page

    def bearer_ok(self, authorization: str | None) -> bool:
        """True if no key is set, or `authorization` is `Bearer <key>` (compared in constant time)."""
        if self.api_key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def login(self, username: str, password: str) -> bool:
        """Gradio's `auth=` check: any user name, the key as the password."""
        return bool(username) and self.api_key is not None and hmac.compare_digest(
            str(password).encode(), self.api_key.encode())

    def launch_kwargs(self) -> dict:
        """`auth=` for `Blocks.launch`: with a key, the page needs the owner's login unless it is public."""
        if self.api_key is None or self.public_page:
            return {}
        return {"auth": self.login, "auth_message": "Higgs Studio: log in with any name and the studio's key."}

    def bearer_login(self, app) -> None:
        """Let a request that carries the key past the page's login on Gradio's own routes of `app` (the page,
        its config, the queue, uploads, `/gradio_api/file=`, all that `gradio_client` calls), as if logged in
        as `OWNER_LOGIN`. Gradio asks one dependency who is logged in, `get_current_user`, on each of them;
        it is overridden to answer for the key first and to ask Gradio's own (the login cookie) otherwise, so
        a browser without the key still gets the login page and a wrong key gets nothing. Launch's
        `auth_dependency` cannot do this: with it Gradio answers 401 where it would show the login."""
        if self.api_key is None:
            return
        logged_in = gradio_dependency(app, GRADIO_USER)
        if logged_in is None:
            raise RuntimeError(f"Gradio's page routes ask no `{GRADIO_USER}` who is logged in, so the key cannot "
                               "pass the page's login: install the Gradio version requirements.txt names.")

        async def owner_or_logged_in(request: fastapi.Request) -> str | None:
            if self.bearer_ok(request.headers.get("authorization")):
                return OWNER_LOGIN
            user = logged_in(request)
            return await user if inspect.isawaitable(user) else user

        app.dependency_overrides[logged_in] = owner_or_logged_in

    def is_owner(self, request: gr.Request | None) -> bool:
        """A page event comes from the owner: no key is set, the session logged in, or it carries the key."""
        if self.api_key is None:
            return True
        if request is None:
            return False
        if getattr(request, "username", None):  # only Gradio's login (the key as password) or `bearer_login` sets it
            return True
        headers = getattr(request, "headers", None) or {}
        return self.bearer_ok(headers.get("authorization"))

    def owner_only(self, fn, *, message: str = OWNER_ONLY):
        """Wrap a page handler that changes or exports the shared library or presets (or is beyond the public
        limits): for anyone but the owner it raises an error saying `message` and `fn` never runs. The wrapper
        takes Gradio's request as an extra first parameter (Gradio fills parameters annotated `gr.Request` and
        `gr.SelectData` by position); a generator stays a generator, so Gradio still streams it."""
        hints = typing.get_type_hints(fn)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in inspect.signature(fn).parameters.values()]

        def check(request) -> None:
            if not self.is_owner(request):
                raise gr.Error(message)

        if inspect.isgeneratorfunction(fn):
            def handler(request, *args):
                check(request)
                yield from fn(*args)
        else:
            def handler(request, *args):
                check(request)
                return fn(*args)

        first = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
        handler.__signature__ = inspect.Signature([first, *params])
        handler.__annotations__ = {"request": gr.Request, **{k: v for k, v in hints.items() if k != "return"}}
        handler.__name__, handler.__doc__ = fn.__name__, fn.__doc__
        return handler

    def anyone(self) -> Caller:
        """Who the page's config is built for: with a key, whoever may load it, so a visitor."""
        return OWNER if self.api_key is None else Caller.visitor("the page's config")

    def page_caller(self, request: gr.Request | None) -> Caller:
        """The caller of a page event (or a `gr.api` endpoint): the owner, or a visitor known by address, else
        by the page's Gradio session."""
        if self.is_owner(request):
            return OWNER
        client = getattr(request, "client", None)
        return visitor(getattr(request, "headers", None) or {}, getattr(client, "host", None),
                       fallback=getattr(request, "session_hash", None) or "anonymous")

    def cross_site_refusal(self, origin: str | None, host: str | None) -> str | None:
        """Why a state-changing request from another site is refused, or None. Only a keyless server needs
        this (a keyed one refuses requests without the key, and browsers never add it on their own): any
        web page can make a visitor's browser POST to http://localhost. `Origin` absent (curl, SDKs) is
        fine; present, it must name this server or a local host."""
        if self.api_key is not None or not origin:
            return None
        parts = urlsplit(origin)
        if parts.hostname in LOCAL_HOSTS or (host and parts.netloc == host):
            return None
        return (f"Requests from another site ({origin}) may not change or use this studio: it has no API key, so "
                "it only accepts writes from its own page, local pages and non-browser clients.")


def gradio_dependency(app, name: str):
    """The dependency called `name` that one of `app`'s own routes (Gradio's page and config are) depends on,
    at any depth, or None."""
    stack = [d for route in app.routes for d in getattr(getattr(route, "dependant", None), "dependencies", ())]
    while stack:
        dependency = stack.pop()
        if getattr(dependency.call, "__name__", None) == name:
            return dependency.call
        stack.extend(dependency.dependencies)
    return None


def client_address(headers: Mapping[str, str], host: str | None) -> str | None:
    """The visitor's address. On a Space (SPACE_ID set) the connection comes from Hugging Face's proxy, which
    names the client first in `X-Forwarded-For`; anywhere else that header is whatever the client wrote, so
    only the connection's own address counts."""
    forwarded = headers.get("x-forwarded-for", "") if os.environ.get("SPACE_ID") else ""
    return forwarded.split(",")[0].strip() or host or None


def visitor(headers: Mapping[str, str], host: str | None, *, fallback: str) -> Caller:
    """A visitor's share: every page and token from one address is one visitor, so several tabs or a script
    with many tokens get one share; `fallback` (a token, a session) names one whose address is unknown."""
    return Caller.visitor(client_address(headers, host) or fallback)


def host_allowed(host: str | None, allowed: typing.Collection[str] = ()) -> bool:
    """Whether a keyless local server answers a request with this `Host` header: a local name (`localhost`,
    `*.localhost`, RFC 6761), an IP address (a rebinding attack needs a name it controls), a name in
    `allowed` (lower case; an entry starting with "." allows its subdomains), or no header at all (HTTP/1.0
    clients; browsers always send one)."""
    if not host:
        return True
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:  # a malformed IPv6 literal
        return False
    if name is None:
        return False
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost") or name in allowed:
        return True
    if any(a.startswith(".") and name.endswith(a) for a in allowed):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: refuse (403 with `WRONG_HOST`, or a closed websocket) every request, reads included,
    whose `Host` is a name this server does not answer to. Without it a keyless studio on 127.0.0.1 is open
    to DNS rebinding: a page on attacker.example re-resolves its name to 127.0.0.1 and becomes same-origin
    with the studio, so the browser lets it read the library and pass the Origin check."""

    def __init__(self, app, allowed: typing.Collection[str] = ()):
        self.app, self.allowed = app, frozenset(allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), None)
            if not host_allowed(host, self.allowed):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                body = json.dumps({"error": {"message": WRONG_HOST.format(host=host), "type": "forbidden",
                                             "code": "wrong_host"}}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def host_guard(bind_host: str, api_key: str | None, allowed_hosts: typing.Iterable[str] = (),
               share: bool = False) -> list:
    """The middleware for `Blocks.launch(app_kwargs={"middleware": ...})`: a `HostGuard` when the server has no
    key and listens on a loopback address (the local default), else none. A keyed server is protected by its
    key; one that listens on the network without a key is reachable by anyone there already, and the names
    people reach it by (LAN names, proxies) cannot be guessed, so it is left alone (app.py warns about it).
    `allowed_hosts` are extra names (`--allowed-hosts`); `share` adds the gradio.live link's names."""
    from starlette.middleware import Middleware

    if api_key or bind_host not in LOCAL_HOSTS:
        return []
    allowed = {h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()}
    if bind_host != "localhost":
        allowed.add(bind_host)
    if share:
        allowed.add(SHARE_DOMAIN)
    return [Middleware(HostGuard, allowed=allowed)]


def friendly_queue_full(demo: gr.Blocks) -> None:
    """Answer a join of a full queue (`demo.queue(max_size=…)`) with `QUEUE_FULL` instead of Gradio's "Queue
    is full. Max size is N and size is N." The page shows the answer as its error toast. Call after
    `demo.queue()` and before `launch()`."""
    queue = demo._queue  # Gradio keeps its queue here; its `push` decides "queue_full"
    push = queue.push

    async def friendly_push(body, request, username):
        ok, result, status = await push(body, request, username)
        if status == "queue_full":
            result = QUEUE_FULL.format(size=queue.max_size)
        return ok, result, status

    queue.push = friendly_push
