"""Tenant scoping of the ids a client chooses: a tenant's program and request ids live in its own namespace.

The dispatcher prefixes the program id and request id of every call with the caller's tenant
(``acme~run-42``) before anything reads Redis, and strips the prefix from what it answers. Another tenant
sending ``run-42`` names ``globex~run-42``: it cannot end, extend, label or read ``acme``'s program, and it
learns nothing of it either (no "permission denied" that would confirm the id exists). Without
authentication (loopback only) the tenant is empty and ids are used as given.

The spelling is ``services.common.tenant_ids``'s: the tenant of every request, program, trace and outcome
row is readable from its id (``chimera queue``).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from services.common.tenant_ids import SEP, client_id, scoped, tenant_of
from services.dispatcher.errors import InvalidRequest
from services.dispatcher.intake import Intake

__all__ = ["SEP", "check_unscoped", "client_id", "scope_intake", "scoped", "tenant_of"]


def check_unscoped(kind: str, ident: str) -> None:
    if SEP in ident:
        raise InvalidRequest(f"{kind} may not contain {SEP!r}")


def scope_intake(intake: Intake, tenant: str) -> Intake:
    """The intake with its ids in ``tenant``'s namespace; a missing request id is drawn here so that it is
    scoped too."""
    check_unscoped("program_id", intake.program_id)
    check_unscoped("request_id", intake.request_id)
    if not tenant:
        return intake
    return replace(
        intake,
        program_id=scoped(tenant, intake.program_id),
        request_id=scoped(tenant, intake.request_id or uuid.uuid4().hex),
    )
