"""What the HTTP door's ``/openapi.json`` says beyond what FastAPI derives from the handlers.

FastAPI sees only the pydantic bodies. The door also reads the ``X-Chimera-*`` identity headers, refuses what
the intake's limits refuse (settings: ``validate.Limits``), and answers errors in OpenAI's shape with 400
where FastAPI would document 422. The schema is what a client (and the schemathesis fuzz in the suite)
trusts, so it states all of that, with the limits of the running settings: a case the schema calls valid is
one the door accepts, barring what a schema cannot say (one non-empty user message, the prompt's size over
messages and stop together, the stage skip against the program's row).

NOTE(5xx): the only server errors documented are 503 (UNAVAILABLE: no live engine for the request, Redis
unreachable, a program's engine dead with nowhere to move) and 504 (DEADLINE_EXCEEDED: the request's
``X-Chimera-Timeout-Ms`` ran out), as in the README. A 500 is a bug, so it is not documented.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from services.common.types import ROLES
from services.dispatcher.auth import keys_required
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.openai_schema import HTTP_ERRORS
from services.dispatcher.validate import ID_PATTERN, MAX_TIMEOUT_MS, WORKFLOW_PATTERN

JSONObj = dict[str, Any]
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")

_ERROR_BODY: JSONObj = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _status(code: str) -> str:
    return str(HTTP_ERRORS[code][0])


def _error(description: str, **headers: str) -> JSONObj:
    out: JSONObj = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    if headers:
        out["headers"] = {h: {"description": d, "schema": {"type": "string"}} for h, d in headers.items()}
    return out


_AUTH_RESPONSES: JSONObj = {
    _status("UNAUTHENTICATED"): _error(
        "no API key, or an unknown or revoked one, where keys are required",
        **{"WWW-Authenticate": "Bearer"},
    ),
    _status("PERMISSION_DENIED"): _error("the key's tenant may not do this"),
}

# Busy, on any call but the probe: the door holds its limit of open calls (door.py), never a 503.
_FULL_DOOR = _error(
    "the door holds its limit of open calls: come back later (never a 503)",
    **{"Retry-After": "whole seconds"},
)
_FULL_DOOR_OR_POOL = _error(
    "the pool is over its queue bound, or the door holds its limit of open calls: come back later "
    "(never a 503)",
    **{"Retry-After": "whole seconds, from the queue's measured drain rate where the pool is full"},
)


def generation_responses() -> JSONObj:
    """Every status the generation routes answer, keyed as OpenAPI keys them."""
    return {
        "200": {
            "description": "the completion; with `stream` true, server-sent events ending with `[DONE]` "
            "(an error after the first event arrives as an `error` event)",
            "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
        },
        _status("INVALID_ARGUMENT"): _error("a malformed field or header, naming it and its limit"),
        **_AUTH_RESPONSES,
        _status("NOT_FOUND"): _error("the pinned model is served by no engine (`param`: model)"),
        _status("FAILED_PRECONDITION"): _error(
            "the stage goes backwards, reuses a request id, or contradicts the program's pinned model"
        ),
        _status("RESOURCE_EXHAUSTED"): _error("a size over its limit (messages, prompt, metadata, body)"),
        "429": _FULL_DOOR_OR_POOL,
        _status("UNAVAILABLE"): _error(
            "no live engine, Redis unreachable, or the program's engine dead with nowhere to move"
        ),
        _status("DEADLINE_EXCEEDED"): _error("X-Chimera-Timeout-Ms ran out before the answer"),
        # Any other client error (an unknown route, a caller gone): the same body.
        "4XX": _error("another client error"),
    }


def identity_headers(s: DispatcherSettings) -> list[JSONObj]:
    """The ``X-Chimera-*`` headers (``http_input``), each optional, with the intake's limits. A header that is
    empty or blank counts as absent; ``metadata`` keys of the same names stand in for absent headers."""

    def header(name: str, schema: JSONObj, description: str) -> JSONObj:
        return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}

    ident = {"type": "string", "maxLength": s.max_id_chars, "pattern": f"^{ID_PATTERN}$"}
    return [
        header(
            "X-Chimera-Program-Id",
            ident,
            "the workflow every stage belongs to; absent: the client's session id (x-session-id and the"
            " other session headers the README lists, or prompt_cache_key), else the program whose"
            " conversation the messages continue, else a new program",
        ),
        header(
            "X-Chimera-Stage",
            {"type": "integer", "minimum": 0, "maximum": s.max_stage},
            "0-based stage index (ASCII digits); absent: the program's next stage. A stage may not go "
            f"backwards (409) nor run more than {s.max_stage_skip} past the one expected next (400)",
        ),
        header(
            "X-Chimera-Workflow",
            {"type": "string", "maxLength": s.max_workflow_chars, "pattern": f"^{WORKFLOW_PATTERN}$"},
            "workflow type, e.g. code/planner-coder; absent: default",
        ),
        header(
            "X-Chimera-Request-Id",
            ident,
            "idempotency key: the same request again re-attaches to it; absent: a fresh id",
        ),
        header(
            "X-Chimera-Timeout-Ms",
            {"type": "integer", "minimum": 0, "maximum": MAX_TIMEOUT_MS},
            "fail with 504 if not finished by then; absent or 0: no deadline",
        ),
    ]


def _narrow(prop: JSONObj, kind: str, **constraints: Any) -> None:
    """Add ``constraints`` to the ``kind`` branch of a property (itself, or one branch of its anyOf)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == kind:
            branch.update(constraints)


def _limit_bodies(schemas: Mapping[str, JSONObj], s: DispatcherSettings) -> None:
    stop_text = {"maxLength": s.max_stop_chars}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = schemas[name]["properties"]
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                _narrow(props[field], "integer", maximum=s.max_tokens_limit)
        props["temperature"].update(minimum=0, maximum=2)
        props["top_p"].update(exclusiveMinimum=0, maximum=1)
        _narrow(props["stop"], "string", **stop_text)
        _narrow(props["stop"], "array", maxItems=s.max_stop_sequences, items={"type": "string", **stop_text})
        props["metadata"]["description"] = (
            f"at most {s.max_metadata_chars} characters of keys and values; program_id, stage, workflow, "
            "request_id and timeout_ms stand in for the X-Chimera-* headers"
        )
    chat = schemas["ChatCompletionRequest"]["properties"]
    chat["messages"].update(minItems=1, maxItems=s.max_messages)
    chat["messages"]["description"] = (
        f"at most {s.max_messages}; with stop, at most {s.max_prompt_chars} characters; "
        "at least one non-empty user message"
    )
    # "developer" is OpenAI's newer name for the system role (http_input.chat_messages).
    schemas["ChatMessageIn"]["properties"]["role"]["enum"] = sorted(ROLES | {"developer"})
    schemas["ContentPart"]["properties"]["type"]["enum"] = ["text"]
    _narrow(schemas["CompletionRequest"]["properties"]["prompt"], "array", minItems=1, maxItems=1)


def describe(app: FastAPI, s: DispatcherSettings) -> JSONObj:
    """The door's OpenAPI document: FastAPI's, with the headers, limits and responses above."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc["components"]["schemas"]
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorBody"] = _ERROR_BODY
    _limit_bodies(schemas, s)
    for path in GENERATION_PATHS:
        op = doc["paths"][path]["post"]
        op["parameters"] = identity_headers(s)
        op["responses"] = generation_responses()
        op["requestBody"]["description"] = f"JSON, at most {s.max_body_bytes} bytes (413 before parsing)"
    end = doc["paths"]["/v1/programs/{program_id}/end"]["post"]
    end["responses"].update(
        {
            **_AUTH_RESPONSES,
            "400": _error("invalid program id or outcome"),
            "429": _FULL_DOOR,
            _status("UNAVAILABLE"): _error("Redis unreachable"),
        }
    )
    end["responses"].pop("422", None)
    models = doc["paths"]["/v1/models"]["get"]
    models["responses"].update(
        {**_AUTH_RESPONSES, "429": _FULL_DOOR, _status("UNAVAILABLE"): _error("Redis unreachable")}
    )
    # An API key (auth.py), as the bearer token; where keys are not required (auth=auto on loopback, or
    # off) calling without one is documented as the other choice.
    doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    security: list[JSONObj] = (
        [{"apiKey": []}] if keys_required(s.auth, s.door_hosts()) else [{}, {"apiKey": []}]
    )
    for op in (models, end, *(doc["paths"][p]["post"] for p in GENERATION_PATHS)):
        op["security"] = security
    return doc


def document(app: FastAPI, s: DispatcherSettings) -> None:
    """Serve ``describe`` as ``/openapi.json`` (FastAPI's documented way: replace ``app.openapi``)."""
    cached: list[JSONObj] = []

    def openapi() -> JSONObj:
        if not cached:
            cached.append(describe(app, s))
        return cached[0]

    setattr(app, "openapi", openapi)  # noqa: B010 (mypy refuses assigning to a method)
