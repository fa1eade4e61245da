"""Transport security: TLS on the front doors, optional mutual TLS between the internal services.

Every server (the dispatcher's gRPC and HTTP doors, the router, the predictor) and the dispatcher's clients
of the router and predictor build their credentials here, from the file paths their settings hold. Each
setting left empty keeps that hop in plaintext, as before: TLS is something an operator turns on, and a
half-configured pair (a certificate without its key) stops the process at start-up rather than silently
serving plaintext.

Files are read once, when a server binds or a channel is made: rotating a certificate means replacing the
files and restarting the process (the README's "Transport security" says in which order).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# gRPC checks the server's certificate against the host part of the address it dials; this option checks
# it against another name instead (one certificate for "router" and "predictor", a health check on 127.0.0.1).
_TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"


class TlsSettingsError(ValueError):
    """TLS settings that cannot work together (a certificate without its key, a CA without a certificate)."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """What a server presents, and whom it accepts: every client (``client_ca_file`` None), or only those
    with a certificate that ``client_ca_file`` signs (mutual TLS)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client checks a server (``ca_file``; None trusts the system's roots) and what it presents
    (``cert_file`` and ``key_file``, for a server that requires client certificates)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str = ""


def check_server(
    cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None = None, *, env: str
) -> None:
    """Raise ``TlsSettingsError`` unless the server settings are all unset or make a usable set.

    ``env`` is the settings' environment prefix (``CHIMERA_ROUTER_``), so the message names the variables
    the operator sets.
    """
    if (cert_file is None) != (key_file is None):
        raise TlsSettingsError(f"{env}TLS_CERT_FILE and {env}TLS_KEY_FILE are set together or not at all")
    if client_ca_file is not None and cert_file is None:
        # Asking for client certificates only makes sense on a TLS port.
        raise TlsSettingsError(f"{env}TLS_CLIENT_CA_FILE needs {env}TLS_CERT_FILE and {env}TLS_KEY_FILE")


def check_client(cert_file: Path | None, key_file: Path | None, *, env: str) -> None:
    """Raise ``TlsSettingsError`` unless a client certificate comes with its key, or neither is set."""
    if (cert_file is None) != (key_file is None):
        raise TlsSettingsError(f"{env}TLS_CERT_FILE and {env}TLS_KEY_FILE are set together or not at all")


def server_tls(
    cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None = None
) -> ServerTls | None:
    """The server's TLS from its settings, or None for plaintext (no certificate configured)."""
    if cert_file is None or key_file is None:
        return None
    return ServerTls(cert_file, key_file, client_ca_file)


def client_tls(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None, server_name: str = ""
) -> ClientTls | None:
    """The client's TLS from its settings, or None for plaintext (neither a CA nor a certificate set)."""
    if ca_file is None and cert_file is None:
        return None
    return ClientTls(ca_file, cert_file, key_file, server_name)


def _read(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """gRPC server credentials; with a client CA, a client without a certificate it signs is refused in
    the handshake, before any call reaches a servicer."""
    key, cert = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=_read(tls.client_ca_file), require_client_auth=tls.mutual
    )


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file),
        private_key=_read(tls.key_file),
        certificate_chain=_read(tls.cert_file),
    )


def _options(tls: ClientTls) -> list[tuple[str, Any]]:
    return [(_TARGET_NAME_OVERRIDE, tls.server_name)] if tls.server_name else []


def add_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> int:
    """Bind ``address`` on ``server``, with TLS when ``tls`` is set; returns the bound port."""
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, server_credentials(tls)))


def aio_channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """An asyncio channel to ``address``, over TLS when ``tls`` is set."""
    if tls is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, channel_credentials(tls), options=_options(tls))


def sync_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    """A blocking channel to ``address`` (health checks), over TLS when ``tls`` is set."""
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, channel_credentials(tls), options=_options(tls))


def uvicorn_ssl(tls: ServerTls | None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments for ``tls`` (none for plaintext).

    uvicorn reads the files itself when its config loads, so a missing file fails the door's start.
    """
    if tls is None:
        return {}
    kwargs: dict[str, Any] = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    if tls.client_ca_file is not None:
        kwargs |= {"ssl_ca_certs": str(tls.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return kwargs


def describe(tls: ServerTls | None) -> str:
    """How a server's port is secured, for its "serving on" log line."""
    if tls is None:
        return "plaintext"
    return "mutual TLS" if tls.mutual else "TLS"
