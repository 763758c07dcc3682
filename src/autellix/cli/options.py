"""Options that several commands share, written once: the scheduler's, the tenants' and admin's, the engines'.

* The scheduler options, generated from :class:`autellix.core.SchedulerConfig`. A
  command names the fields it exposes and takes one ``overrides:
  SchedulerOverrides`` parameter where the options go in its signature::

      @scheduler_options("policy", "beta")
      def gateway(..., overrides: SchedulerOverrides = NO_OVERRIDES, ...) -> None:
          config = overrides.config()  # $AUTELLIX_* and the options given, validated

  Each field becomes ``--<field>`` with the field's type (lists as comma-separated
  text, which ``SchedulerConfig`` parses), its help from ``HELP`` (registry names
  from the registries) plus where a value not given comes from, and no default
  of its own: a value not given leaves the base configuration's.
* Groups of options ``autellix gateway`` and ``autellix epp`` share, each a dataclass whose
  fields become the options, folded into one parameter the same way (``option_group``):
  the tenants' keys and limits and the admin listener (:class:`AccessOptions`), and
  where the engines are (:class:`EngineOptions`: ``--engine``, or ``--discovery kubernetes``).
"""

from __future__ import annotations

import enum
import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from autellix.cli.common import fail, one_of
from autellix.core.config import BALANCERS, POLICIES, ConfigError, SchedulerConfig

if TYPE_CHECKING:
    from autellix.control.limits import TenantLimits
    from autellix.gateway.engines import Discovery

#: What each option says, for every field of SchedulerConfig (tests/test_cli.py checks).
HELP: dict[str, str] = {
    "policy": one_of(POLICIES),
    "boundaries": "Queue boundaries in seconds of service, e.g. 0.5,2,8,32",
    "quanta": "Steps per queue, e.g. 64,128,256,512,inf",
    "beta": "Anti-starvation ratio, inf disables",
    "backlog_factor": "Promote a program that waits this many times longer than the backlog's programs (>= 1)",
    "balancer": one_of(BALANCERS),
    "long_prompt_tokens": "Calls with more prompt tokens than this stick to their program's engine",
    "cached_tokens_per_call": "Algorithm 2: prompt tokens an engine holds that weigh as one call in flight "
                              "on an engine of 8 slots (a short call's weigh more on larger engines; the KV "
                              "event index; 0: least load alone)",
    "program_idle_ttl": "Seconds without a call after which a program is dropped",
    "multi_step": "Re-plan the queues every N steps",
    "max_preemptions": "Engine: running calls preempted per step for better-ranked waiting ones (0: never)",
}
#: Lower bounds the option checks itself (SchedulerConfig checks the rest).
MIN: dict[str, int] = {"multi_step": 1, "max_preemptions": 0, "cached_tokens_per_call": 0}
#: Where a value not given comes from for the commands that start from ``SchedulerConfig.from_env()``.
FROM_ENV = "$AUTELLIX_{NAME}"

_HINTS = typing.get_type_hints(SchedulerConfig)
_FIELDS = tuple(f.name for f in fields(SchedulerConfig))


def option_type(name: str) -> type:
    """The option's value type: the field's, a tuple field's as comma-separated text."""
    hint = _HINTS[name]
    return str if typing.get_origin(hint) is tuple else hint


def option_help(name: str, *, defaults: str | None = FROM_ENV, text: str | None = None) -> str:
    """``text`` (default ``HELP[name]``), then ``(default: ...)`` from the ``defaults`` template."""
    text = HELP[name] if text is None else text
    return text if defaults is None else f"{text} (default: {defaults.format(NAME=name.upper())})"


@dataclass(frozen=True)
class SchedulerOverrides:
    """The scheduler options a command was given, by SchedulerConfig field (None: not given)."""

    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if v is not None}

    def with_values(self, **values: Any) -> SchedulerOverrides:
        """A copy with these values (None: as not given)."""
        return SchedulerOverrides({**self.values, **values})

    def apply(self, base: SchedulerConfig) -> SchedulerConfig:
        """``base`` with the values given, validated (``ConfigError`` when one is not valid)."""
        return base.with_overrides(**self.values)

    def config(self, base: SchedulerConfig | None = None) -> SchedulerConfig:
        """``base`` (default: ``SchedulerConfig.from_env()``) with the values given; a value
        out of range, given or in the environment, ends the command (exit code 2)."""
        try:
            return self.apply(SchedulerConfig.from_env() if base is None else base)
        except ConfigError as exc:
            raise fail(str(exc)) from None


#: The default of a command's ``overrides`` parameter (the CLI always passes one).
NO_OVERRIDES = SchedulerOverrides()


def scheduler_options(*names: str, defaults: str | None = FROM_ENV,
                      help_text: Mapping[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command ``--<name>`` for these SchedulerConfig fields, in this order, where its
    ``overrides`` parameter is; the command gets them as one :class:`SchedulerOverrides`.

    ``defaults``: where a value not given comes from, for the help (``{NAME}``: the
    field's name in capitals; None: not said); ``help_text``: a command's own text for a field."""
    unknown = [n for n in names if n not in _FIELDS] + [n for n in help_text or {} if n not in names]
    if unknown:
        raise ValueError(f"not scheduler options here: {unknown}; SchedulerConfig has {', '.join(_FIELDS)}")
    texts = dict(help_text or {})
    options = [inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
        annotation=Annotated[option_type(name) | None, typer.Option(
            help=option_help(name, defaults=defaults, text=texts.get(name)), min=MIN.get(name))])
        for name in names]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        folded = _fold(command, "overrides", options, SchedulerOverrides)
        folded.scheduler_options = names  # type: ignore[attr-defined]  # what the command exposes
        return folded

    return decorate


def _fold(command: Callable[..., Any], parameter: str, options: Sequence[inspect.Parameter],
          make: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """``command`` with its ``parameter`` replaced by ``options`` (what typer reads), which it gets back as one
    value: ``make`` of the options' values by name."""
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index(parameter)

    @functools.wraps(command)
    def folded(*args: Any, **kwargs: Any) -> Any:
        given = {option.name: kwargs.pop(option.name) for option in options}
        return command(*args, **{parameter: make(given)}, **kwargs)

    exposed = signature.replace(parameters=[*params[:at], *options, *params[at + 1:]])
    folded.__signature__ = exposed  # type: ignore[attr-defined]  # what typer reads
    folded.__annotations__ = {p.name: p.annotation for p in exposed.parameters.values()} | {
        "return": signature.return_annotation}
    return folded


# ---- option groups: the tenants' and admin's, the engines' (``autellix gateway``, ``autellix epp``) ---------
def _option(text: str, *, min: float | None = None) -> dict[str, Any]:
    """A group field's option: its help, and its lower bound if it has one."""
    return {"help": text, "min": min}


def option_group(group: type, into: str, *,
                 help_text: Mapping[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command every field of the dataclass ``group`` as ``--<field>`` (its type, default and
    ``_option`` metadata) where its ``into`` parameter is; the command gets them as one ``group``.
    ``help_text``: a command's own text for a field."""
    hints = typing.get_type_hints(group)
    texts = dict(help_text or {})
    unknown = [n for n in texts if n not in hints]
    if unknown:
        raise ValueError(f"not {group.__name__} fields: {unknown}")
    options = [inspect.Parameter(
        f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default,
        annotation=Annotated[hints[f.name], typer.Option(help=texts.get(f.name, f.metadata["help"]),
                                                         min=f.metadata["min"])])
        for f in fields(group)]
    return lambda command: _fold(command, into, options, lambda given: group(**given))


@dataclass(frozen=True)
class AccessOptions:
    """Who may call and who may administer: the tenants' keys and limits, the admin listener."""

    api_keys_file: Path | None = field(default=None, metadata=_option(
        "Tenants' keys (file or Secret directory); also $AUTELLIX_API_KEYS"))
    allow_anonymous: bool = field(default=False, metadata=_option(
        "Serve beyond loopback without tenant keys (refused otherwise)"))
    admin_port: int | None = field(default=None, metadata=_option(
        "The admin listener's port (engines, drain, calls, sessions for tenants); none without", min=0))
    admin_host: str = field(default="127.0.0.1", metadata=_option("The admin listener's address"))
    admin_keys_file: Path | None = field(default=None, metadata=_option(
        "Admin keys (file or Secret directory); also $AUTELLIX_ADMIN_KEYS; needed beyond loopback"))
    tenant_max_concurrent: int | None = field(default=None, metadata=_option(
        "Calls one tenant may run at once", min=1))
    tenant_max_queued: int = field(default=0, metadata=_option("Calls one tenant may queue beyond those", min=0))
    tenant_queue_timeout: float = field(default=30.0, metadata=_option(
        "Seconds a queued call waits, then 429", min=0.1))
    tenant_rpm: float | None = field(default=None, metadata=_option("Requests per minute per tenant", min=0.001))

    def limits(self, **more: Any) -> TenantLimits:
        """The limits of every tenant these options set, and ``more`` (a command's own)."""
        from autellix.control.limits import TenantLimits

        return TenantLimits(max_concurrent=self.tenant_max_concurrent, max_queued=self.tenant_max_queued,
                            queue_timeout_s=self.tenant_queue_timeout, requests_per_minute=self.tenant_rpm, **more)

    def listeners(self) -> dict[str, Any]:
        """``GatewayConfig``'s fields of keys and listeners: who may call, and the admin listener."""
        return {name: getattr(self, name) for name in ("api_keys_file", "allow_anonymous", "admin_port",
                                                          "admin_host", "admin_keys_file")}


class DiscoveryKind(enum.StrEnum):
    static = "static"
    kubernetes = "kubernetes"


@dataclass(frozen=True)
class EngineOptions:
    """Where the engines are: static URLs, or the ready endpoints Kubernetes discovery finds."""

    engine: list[str] | None = field(default=None, metadata=_option("Engine base URL (repeatable; static)"))
    discovery: DiscoveryKind = field(default=DiscoveryKind.static, metadata=_option(
        "static: the --engine URLs; kubernetes: ready endpoints of the engine Services"))
    engine_selector: str = field(default="app.kubernetes.io/component=engine", metadata=_option(
        "kubernetes: label selector of the engines' EndpointSlices"))
    namespace: str | None = field(default=None, metadata=_option("kubernetes: namespace to watch (default: all)"))
    engine_port_name: str = field(default="http", metadata=_option(
        "kubernetes: name of the engines' HTTP port (8000 when a slice has none of that name)"))

    def source(self) -> tuple[list[str], Discovery | None]:
        """The static engine URLs, or the Kubernetes discovery that finds them; a bad combination ends the
        command (exit code 2)."""
        engines = list(self.engine or [])
        if self.discovery is DiscoveryKind.static and not engines:
            raise fail("give at least one --engine URL, or --discovery kubernetes")
        if self.discovery is DiscoveryKind.static:
            return engines, None
        if engines:
            raise fail("--engine is for --discovery static; kubernetes discovery finds the engines itself")
        from autellix.gateway.kube_discovery import KubeDiscovery

        return [], KubeDiscovery(self.engine_selector, self.namespace or None, port_name=self.engine_port_name)


#: The scheduler options of the commands that run the gateway's parts (``autellix gateway``, ``autellix epp``).
GATEWAY_SCHEDULER_OPTIONS = ("policy", "beta", "backlog_factor", "balancer", "cached_tokens_per_call")


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def gateway_options(*, help_text: Mapping[str, str] | None = None) -> Decorator:
    """What ``autellix gateway`` and ``autellix epp`` share (both run the gateway's parts): the scheduler options
    of ``GATEWAY_SCHEDULER_OPTIONS`` (``overrides``), where the engines are (``engines``) and who may call and
    administer (``access``). ``help_text``: the command's own text for a field of either group."""
    texts = dict(help_text or {})
    groups = {group: {n: t for n, t in texts.items() if n in typing.get_type_hints(group)}
              for group in (EngineOptions, AccessOptions)}
    unknown = set(texts) - {n for part in groups.values() for n in part}
    if unknown:
        raise ValueError(f"not gateway options: {sorted(unknown)}")

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = option_group(AccessOptions, "access", help_text=groups[AccessOptions])(command)
        command = option_group(EngineOptions, "engines", help_text=groups[EngineOptions])(command)
        return scheduler_options(*GATEWAY_SCHEDULER_OPTIONS)(command)

    return decorate


#: The defaults of a command's ``access`` and ``engines`` parameters (the CLI always passes them).
NO_ACCESS = AccessOptions()
NO_ENGINES = EngineOptions()

#: ``--tokenizer`` of the gateway and the picker.
TokenizerOption = Annotated[Path | None, typer.Option(
    help="The model's tokenizer.json for exact prompt lengths, or its folder: with a chat template there, Chat "
         "Completions prompts are looked up in the engines' KV cache events (else the engines' own tokenizer is)")]
#: ``--kv-index`` of the gateway and the picker.
KvIndexOption = Annotated[bool, typer.Option(
    help="Route by what the engines hold: follow the KV cache events of engines that publish them "
         "(docs/gateway.md, 'KV event index')")]


__all__ = ["FROM_ENV", "GATEWAY_SCHEDULER_OPTIONS", "HELP", "MIN", "NO_ACCESS", "NO_ENGINES", "NO_OVERRIDES",
           "AccessOptions", "DiscoveryKind", "EngineOptions", "KvIndexOption", "SchedulerOverrides", "TokenizerOption",
           "gateway_options", "option_group", "option_help", "option_type", "scheduler_options"]
