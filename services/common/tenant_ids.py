"""How a tenant's ids are spelled in Redis: ``<tenant>~<the client's id>`` (``services.dispatcher.tenancy``
decides when; everything that reads ids back, such as ``chimera queue``, parses them here).

``~`` is never part of a client's id, so a scoped id parses back without ambiguity.
"""

from __future__ import annotations

SEP = "~"


def scoped(tenant: str, ident: str) -> str:
    """``ident`` in ``tenant``'s namespace (unchanged when there is no tenant)."""
    return f"{tenant}{SEP}{ident}" if tenant else ident


def client_id(ident: str) -> str:
    """The id as its client chose it."""
    return ident.rpartition(SEP)[2]


def tenant_of(ident: str) -> str:
    """The tenant a scoped id belongs to; "" for an unscoped one."""
    return ident.rpartition(SEP)[0]
