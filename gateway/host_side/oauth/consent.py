"""The consent page: the owner lets an app in, or not (``GET``/``POST /consent``).

``/authorize`` (the SDK's handler) checks the app's request and sends the browser here. The page,
in the dashboard's look, names the app, the host it will return to and what it asks for; Allow or
Deny decide, and the owner chooses which devices the app may use: all of them (present and
future), or some, ticked by name or matched by name globs (``device_choice.py``). With a host
token set, the owner signs in on the page with it (a password field) or
is already signed in to the dashboard. The page cannot be framed (clickjacking), and the form is
CSRF-protected (``consent_requests.py``); its cookies are ``Secure`` whenever the browser came
over HTTPS, to the gateway or to a trusted proxy (``origin.py``). The answer goes back to the
app's redirect URI with the issuer (RFC 9207 ``iss``) and the request's ``state``. A request
refused before it gets here is shown to the owner on a page of the same look (``refusal``).
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Sequence

from mcp.server.auth.provider import construct_redirect_uri
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.devices.audit import Actor
from gateway.host_side.dashboard.session import COOKIE, LIFETIME, Sessions
from gateway.host_side.device_scope import Named
from gateway.host_side.oauth.consent_requests import ConsentRequest, ConsentRequests
from gateway.host_side.oauth.credentials import CREDENTIAL_PREFIX
from gateway.host_side.oauth.device_choice import Fleet, chosen_devices, device_choice
from gateway.host_side.oauth.origin import CURRENT
from gateway.host_side.oauth.provider import GatewayProvider
from gateway.net.rate_limit import RateLimiter, rate_limited

__all__ = ["ConsentPage", "in_words", "refusal"]

CSRF_COOKIE = "gateway_consent"
_WHAT = {
    "devices.list": "see your devices and their tools",
    "tools.call": "call your devices' tools (turn things on and off, read sensors)",
}


def in_words(scope: str) -> str:
    """What a scope lets an app do, as the consent page and Connected apps say it."""
    return _WHAT.get(scope, scope)


class ConsentPage:
    """The page's two routes."""

    def __init__(
        self,
        provider: GatewayProvider,
        consents: ConsentRequests,
        sessions: Sessions | None,
        fleet: Fleet = lambda: (),
    ) -> None:
        self.provider, self.consents, self.sessions = provider, consents, sessions
        self.fleet = fleet  # the devices the owner may tick

    def routes(self) -> list[Route]:
        """``/consent`` to show, and to answer (sign-in attempts rate-limited per address)."""
        answer = rate_limited(self.answer, RateLimiter(per_minute=20, burst=10), "consent answers")
        return [
            Route("/consent", endpoint=self.show, methods=["GET"]),
            Route("/consent", endpoint=answer, methods=["POST"]),
        ]

    @property
    def _sign_in(self) -> bool:
        return self.sessions is not None and self.sessions.required

    async def show(self, request: Request) -> Response:
        """The page for a waiting request."""
        shown = self.consents.show(request.query_params.get("request", ""))
        if shown is None:
            return _page(
                "<h1>This request has expired</h1><p>Start again from the app.</p>", status=400
            )
        waiting, csrf = shown
        signed_in = self._signed_in(request)
        ask = self._sign_in and not signed_in
        response = _page(
            _form(waiting, request.query_params["request"], csrf, ask, self.fleet()),
            redirect=waiting,
        )
        return _with_csrf(response, csrf)

    async def answer(self, request: Request) -> Response:
        """Allow or Deny, from the page's form."""
        form = await request.form()
        request_id, csrf = str(form.get("request", "")), str(form.get("csrf", ""))
        cookie = request.cookies.get(CSRF_COOKIE, "")
        waiting = self.consents.check(request_id, csrf, cookie)
        if waiting is None:
            return _page(
                "<h1>Refused</h1><p>This form is stale or did not come from this "
                "gateway's page (CSRF check). Start again from the app.</p>",
                403,
            )
        actor = Actor("dashboard", request.client.host if request.client else None)
        allow = form.get("decision") == "allow"
        try:
            devices = chosen_devices(form) if allow else None
        except ValueError as exc:  # nothing chosen, or too much: the same request, once more
            ask = self._sign_in and not self._signed_in(request)
            return self._again(waiting, request_id, ask, str(exc), 400)
        response: Response | None = None
        if self._sign_in and not self._signed_in(request):
            response = self._sign_in_with(str(form.get("token", "")), request)
            if response is None:  # wrong token: the same request may be answered again
                why = "That is not this gateway's host token."
                return self._again(waiting, request_id, True, why, 401)
        self.consents.drop(request_id)
        params, origin = waiting.params, waiting.origin
        if allow:
            code = self.provider.grant(waiting.client, params, origin.resource, actor, devices)
            target = construct_redirect_uri(
                str(params.redirect_uri), code=code, state=params.state, iss=origin.issuer
            )
        else:
            self.provider.refused(waiting.client, actor)
            target = construct_redirect_uri(
                str(params.redirect_uri),
                error="access_denied",
                error_description="the owner denied access",
                state=params.state,
                iss=origin.issuer,
            )
        redirect = RedirectResponse(target, 303, headers={"Cache-Control": "no-store"})
        if response is not None:  # signed in on this page: the dashboard knows this browser now
            for key, value in response.headers.items():
                if key == "set-cookie":
                    redirect.headers.append(key, value)
        redirect.delete_cookie(CSRF_COOKIE, path="/")
        return redirect

    def _again(
        self, waiting: ConsentRequest, request_id: str, ask_token: bool, error: str, status: int
    ) -> Response:
        """The page for the same request once more, saying what was wrong."""
        shown = self.consents.show(request_id)
        assert shown is not None
        body = _form(waiting, request_id, shown[1], ask_token, self.fleet(), error)
        return _with_csrf(_page(body, status, redirect=waiting), shown[1])

    def _signed_in(self, request: Request) -> bool:
        return self.sessions is not None and (
            not self.sessions.required or self.sessions.get(request.cookies.get(COOKIE)) is not None
        )

    def _sign_in_with(self, token: str, request: Request) -> Response | None:
        """A response carrying a new dashboard session cookie, or None for a wrong token."""
        assert self.sessions is not None
        session = self.sessions.login(token) if token else None
        if session is None:
            return None
        response = Response()
        response.set_cookie(
            COOKIE,
            session.id,
            max_age=int(LIFETIME),
            path="/",
            httponly=True,
            samesite="strict",
            secure=CURRENT.get().https,
        )
        return response


def _with_csrf(page: HTMLResponse, csrf: str) -> HTMLResponse:
    """``page`` with the cookie copy of its form's CSRF value (``consent_requests.py``)."""
    page.set_cookie(
        CSRF_COOKIE,
        csrf,
        max_age=600,
        path="/",
        httponly=True,
        samesite="strict",
        secure=CURRENT.get().https,
    )
    return page


def refusal(reason: str, status: int) -> HTMLResponse:
    """The page a browser gets for an authorization request refused before consent."""
    return _page(
        f'<h1>This app cannot sign in</h1><p id="reason">{html.escape(reason)}</p>'
        "<p>Tell the app's maker, or check the app's settings; nothing was granted.</p>",
        status,
    )


def _form(
    waiting: ConsentRequest,
    request_id: str,
    csrf: str,
    ask_token: bool,
    fleet: Sequence[Named],
    error: str = "",
) -> str:
    client, params = waiting.client, waiting.params
    name = html.escape(client.client_name or "An app with no name")
    redirect = urllib.parse.urlsplit(str(params.redirect_uri))
    where = html.escape(redirect.netloc or redirect.scheme + ":")
    scopes = params.scopes or list(_WHAT)
    asks = "".join(f"<li>{html.escape(in_words(s))}</li>" for s in scopes)
    client_id = html.escape(client.client_id)
    if client.client_id.startswith("https://"):
        domain = urllib.parse.urlsplit(client.client_id).netloc
        vouched = f"described by its owner at {html.escape(domain)}"
    elif client.client_id.startswith(CREDENTIAL_PREFIX):
        vouched = "using app credentials made on this gateway's dashboard or CLI"
    else:  # dynamic registration: anyone can register any name
        vouched = "registered itself with this gateway: its name is its own claim"
    token = (
        (
            '<label>Host token <input name="token" type="password" '
            'autocomplete="current-password"></label><p class="hint">Not needed if this '
            "browser is signed in to the dashboard.</p>"
        )
        if ask_token
        else ""
    )
    shown_error = (
        f'<p id="error" class="error" role="alert">{html.escape(error)}</p>' if error else ""
    )
    return f"""<form id="login" class="consent" method="post" action="consent">
  <h1>Allow <span id="app-name">{name}</span>?</h1>
  <p>The app <strong>{name}</strong> (<code id="client-id">{client_id}</code>,
  <span id="vouched">{vouched}</span>) asks to reach your devices through this
  gateway. After you answer, your browser returns to <strong id="redirect-host">{where}</strong>.
  </p>
  <p>It asks to:</p><ul id="scopes">{asks}</ul>
  {device_choice(fleet)}
  <p>It can never approve devices, change settings, or use tools meant for you only. You can
  revoke it at any time under Connected apps on the dashboard.</p>
  {token}{shown_error}
  <input type="hidden" name="request" value="{html.escape(request_id)}">
  <input type="hidden" name="csrf" value="{html.escape(csrf)}">
  <div class="actions"><button type="submit" name="decision" value="allow" id="allow">Allow</button>
  <button type="submit" name="decision" value="deny" id="deny" class="secondary">Deny</button></div>
</form>"""


def _page(body: str, status: int = 200, redirect: ConsentRequest | None = None) -> HTMLResponse:
    """The page around ``body``: the dashboard's stylesheet, never in a frame, never cached."""
    form_action = "'self'"
    if redirect is not None:  # CSP form-action also covers where the form's answer redirects
        target = urllib.parse.urlsplit(str(redirect.params.redirect_uri))
        form_action += (
            f" {target.scheme}:" if not target.netloc else (f" {target.scheme}://{target.netloc}")
        )
    csp = (
        "default-src 'self'; style-src 'self'; script-src 'none'; frame-ancestors 'none'; "
        f"form-action {form_action}; base-uri 'none'"
    )
    headers = {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",  # "no-referrer" makes the form's Origin null
        "Cache-Control": "no-store",
    }
    document = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>Allow an app · esp-mcp-gateway</title>"
        '<link rel="stylesheet" href="static/style.css"></head>'
        f'<body class="login">{body}</body></html>'
    )
    return HTMLResponse(document, status, headers=headers)
