"""Every configuration knob of every service, read from the settings classes themselves.

``chimera knobs`` prints them as the Markdown table the README carries; ``chimera docs`` also writes each
service's own rows into its README, and a test checks every such table against the code.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices
from pydantic_settings import BaseSettings

# (service, module, class): one row group per service, shared knobs first.
SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("all services", "services.common.config", "CommonSettings"),
    ("dispatcher", "services.dispatcher.config", "DispatcherSettings"),
    ("router", "services.router.config", "RouterSettings"),
    ("predictor", "services.predictor.config", "PredictorSettings"),
    ("worker", "services.worker.config", "WorkerSettings"),
    ("jobs", "services.jobs.config", "JobsSettings"),
    ("launcher", "services.launcher.config", "LauncherSettings"),
    ("workload", "services.workload.config", "WorkloadSettings"),
    ("verify", "services.verify.config", "VerifySettings"),
)


@dataclass(frozen=True, slots=True)
class Knob:
    service: str
    env: str
    default: str
    description: str


def _env_name(cls: type[BaseSettings], name: str) -> str:
    field = cls.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    prefix = str(cls.model_config.get("env_prefix", ""))
    return f"{prefix}{name}".upper()


# The checkout the settings modules were imported from: defaults inside it are shown relative to it.
_REPOSITORY = Path(__file__).resolve().parents[2]


def _show(value: object) -> str:
    # Defaults built from the checkout or the home folder are shown machine-independently.
    if value is None:
        return ""
    text = str(value)
    if isinstance(value, Path) and value.is_relative_to(_REPOSITORY):
        return str(value.relative_to(_REPOSITORY))
    return text.replace(str(Path.home()), "~")


def knobs() -> Iterator[Knob]:
    seen: set[str] = set()
    for service, module, name in SETTINGS:
        cls = getattr(importlib.import_module(module), name)
        for field_name, field in cls.model_fields.items():
            env = _env_name(cls, field_name)
            if env in seen:
                continue  # a shared knob, listed once under "all services"
            seen.add(env)
            default = (
                "(required)" if field.is_required() else _show(field.get_default(call_default_factory=True))
            )
            yield Knob(service, env, default, (field.description or "").replace("|", "\\|"))


def _default(k: Knob) -> str:
    return k.default and f"`{k.default}`"


def markdown() -> str:
    lines = ["| service | environment variable | default | meaning |", "|---|---|---|---|"]
    lines += [f"| {k.service} | `{k.env}` | {_default(k)} | {k.description} |" for k in knobs()]
    return "\n".join(lines)


def service_markdown(service: str) -> str:
    """The rows of one service, without the shared knobs (its README names those in prose)."""
    rows = [k for k in knobs() if k.service == service]
    if not rows:
        raise KeyError(f"no settings class for service {service!r}; known: {[s for s, _, _ in SETTINGS]}")
    lines = ["| environment variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{k.env}` | {_default(k)} | {k.description} |" for k in rows]
    return "\n".join(lines)
