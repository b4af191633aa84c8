"""``/login`` and ``/logout``: the form that trades ``server.token`` for the session cookie
(:mod:`crawlhub.web.session`), and the button that drops it."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from crawlhub.api import routing
from crawlhub.api.errors import retry_after_header
from crawlhub.api.guard import Hosts, RequestGuard
from crawlhub.api.throttle import Throttle, client_of
from crawlhub.web import session
from crawlhub.web.render import HEADERS, page

router = routing.router()


def _token(request: Request) -> str | None:
    return request.app.state.token


@router.get(session.LOGIN_PATH)
async def login_form(request: Request, next: str = "/") -> Response:
    if not _token(request):  # no token set: nothing to log in to
        return RedirectResponse(session.safe_next(next), status_code=303)
    return _form(request, next=session.safe_next(next), error=None)


@router.post(session.LOGIN_PATH)
async def login(request: Request) -> Response:
    token = _token(request)
    if not token:
        return RedirectResponse("/", status_code=303)
    if not _same_site(request):
        return _form(request, status=403, next="/", error="this form was sent from another"
                     " site; open the login page of this server and log in there")
    # a form is a few fields; BodyGuard has bounded its size and time already
    body = (await request.body()).decode("utf-8", "replace")
    fields = parse_qs(body, max_num_fields=10)
    given = (fields.get("token") or [""])[0]
    target = session.safe_next((fields.get("next") or ["/"])[0])
    throttle: Throttle = request.app.state.throttle
    client = client_of(request.scope)
    wait = throttle.wait(client)
    if wait > 0:  # not even compared: a guesser learns nothing while it waits
        answer = _form(request, status=429, next=target, error="too many wrong tokens from"
                       f" this address: try again in {retry_after_header(wait)} s")
        answer.headers["Retry-After"] = retry_after_header(wait)
        return answer
    if not given or not session.token_matches(token, given):
        throttle.failed(client, "login")
        return _form(request, status=401, next=target, error="wrong token: paste the"
                     " server's token (server.token in its config)")
    answer = RedirectResponse(target, status_code=303, headers=HEADERS)
    answer.set_cookie(session.COOKIE, session.issue(token), max_age=session.SESSION_SECONDS,
                      path="/", httponly=True, samesite="strict",
                      secure=request.url.scheme == "https")
    return answer


@router.post(session.LOGOUT_PATH)
async def logout(request: Request) -> Response:
    """Reached only with a valid session (or the bearer token) and, for a cookie, the
    CSRF header: htmx's button follows ``HX-Redirect``, a script gets 303."""
    if request.headers.get("hx-request"):
        answer: Response = Response(status_code=204, headers={"HX-Redirect":
                                                              session.LOGIN_PATH})
    else:
        answer = RedirectResponse(session.LOGIN_PATH, status_code=303)
    answer.delete_cookie(session.COOKIE, path="/", httponly=True, samesite="strict")
    return answer


def _form(request: Request, *, next: str, error: str | None, status: int = 200) -> Response:
    return page(request, "login.html", area="login", title="Log in", status=status,
                next=next, error=error, hours=session.SESSION_SECONDS // 3600)


def _same_site(request: Request) -> bool:
    """The login form was posted from a page of this server (login CSRF: another site
    must not log a browser in with a token of its choosing): the API's own rule
    (:meth:`crawlhub.api.guard.RequestGuard.same_origin`), which has already run."""
    hosts: Hosts = request.app.state.hosts
    return RequestGuard.same_origin(request.scope, request.headers.get("host", ""),
                                    hosts.listed)
