"""What every dashboard page shares: who is signed in (:class:`Who`, read again from the
key's row on each request), the CSRF check of a form, and errors answered as pages a person
reads (:class:`Pages`). ``routes`` and ``approvals`` serve their pages with these."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape

from conveyor.api.deps import ServiceDep
from conveyor.engine.records import TenantRef
from conveyor.exceptions import ConveyorError, NotFound
from conveyor.ui.sessions import COOKIE, Session, Signer, csrf_matches


class SignInNeeded(Exception):
    """No session, or its key was revoked."""


class Forbidden(Exception):
    """A form posted without its session's CSRF token."""


class Pages(APIRoute):
    """A route whose errors answer as pages a person reads."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInNeeded:
                target = urlencode({"next": request.url.path})
                return RedirectResponse(f"/ui/signin?{target}", status_code=303)
            except Forbidden:
                return error_page(request, 403, "This form is stale or was not sent by this "
                                  "dashboard (its CSRF token is missing or wrong); reload the "
                                  "page and try again.")  # fmt: skip
            except RequestValidationError:
                return error_page(request, 404, "Nothing here has that id.")
            except NotFound as exc:
                return error_page(request, 404, str(exc))
            except ConveyorError as exc:
                return error_page(request, 409, str(exc))

        return answer


_templates = Environment(
    loader=PackageLoader("conveyor.ui"), autoescape=select_autoescape(default=True)
)


def render(request: Request, name: str, code: int = 200, **values: Any) -> HTMLResponse:
    body = _templates.get_template(name).render(request=request, **values)
    return HTMLResponse(body, status_code=code, headers={"Cache-Control": "no-store"})


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", status, status=status, message=message, who=None)


def signer(request: Request) -> Signer:
    signer: Signer = request.app.state.ui_signer
    return signer


# -- who is signed in ---------------------------------------------------------------------------


class Who:
    """The signed-in tenant (with its key's name, as the API records it) and the session.

    Whether it is an operator's comes from the key's row, read again on each request, never
    from the cookie: a tenant's session cannot become an operator's."""

    def __init__(self, tenant: TenantRef, session: Session, csrf: str) -> None:
        self.tenant, self.session, self.csrf = tenant, session, csrf
        self.operator = tenant.operator

    @property
    def scope(self) -> uuid.UUID | None:
        """The tenant whose rows this session reads; None (every tenant) for an operator."""
        return None if self.operator else self.tenant.id


def filtered(who: Who, names: dict[uuid.UUID, str], tenant: str) -> uuid.UUID | None:
    """The tenant whose rows a list shows: an operator's ``?tenant=NAME`` filter (a name no
    tenant has shows nothing), else the session's own scope; a tenant's session has no
    filter, whatever it asks."""
    if not who.operator or not tenant:
        return who.scope
    return next((i for i, n in names.items() if n == tenant), uuid.UUID(int=0))


def signed_in(request: Request, service: ServiceDep) -> Who:
    cookie = request.cookies.get(COOKIE)
    claimed = Signer.claimed(cookie)
    if claimed is None:
        raise SignInNeeded()
    with service.db.transaction() as store:
        found = store.session_key(claimed.key_prefix)
    tenant, key_secret = found if found is not None else (None, None)
    if tenant is None or key_secret is None or tenant.id != claimed.tenant_id:
        raise SignInNeeded()  # the key was revoked, or signed out, since
    session = signer(request).read(cookie, key_secret)
    if session is None:
        raise SignInNeeded()
    return Who(tenant, session, signer(request).csrf(session, key_secret))


WhoDep = Annotated[Who, Depends(signed_in)]


async def _form(request: Request) -> dict[str, list[str]]:
    return parse_qs((await request.body()).decode(errors="replace"))


FormDep = Annotated[dict[str, list[str]], Depends(_form)]


def checked(request: Request, who: Who, form: dict[str, list[str]]) -> None:
    if not csrf_matches(who.csrf, next(iter(form.get("csrf", [])), None)):
        raise Forbidden()


def back(path: str, note: str) -> RedirectResponse:
    joined = "&" if "?" in path else "?"
    return RedirectResponse(f"{path}{joined}{urlencode({'note': note})}", status_code=303)
