"""FastAPI dependencies: the service, and the tenant an API key acts for."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conveyor.engine.records import TenantRef
from conveyor.exceptions import AuthError
from conveyor.service import Conveyor

_bearer = HTTPBearer(auto_error=False, description="An API key from `conveyor keys create`.")


def get_service(request: Request) -> Conveyor:
    service: Conveyor = request.app.state.service
    return service


ServiceDep = Annotated[Conveyor, Depends(get_service)]


def get_tenant(
    service: ServiceDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TenantRef:
    """Every /v1 call acts for the tenant of its key, and sees nothing of any other."""
    if credentials is None:
        raise AuthError()
    return service.authenticate(credentials.credentials)


TenantDep = Annotated[TenantRef, Depends(get_tenant)]
