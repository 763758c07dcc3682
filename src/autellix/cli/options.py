"""The scheduler options, generated once from :class:`autellix.core.SchedulerConfig`.

A command names the fields it exposes and takes one ``overrides:
SchedulerOverrides`` parameter where the options go in its signature::

    @scheduler_options("policy", "beta")
    def gateway(..., overrides: SchedulerOverrides = NO_OVERRIDES, ...) -> None:
        config = overrides.config()  # $AUTELLIX_* and the options given, validated

Each field becomes ``--<field>`` with the field's type (lists as comma-separated
text, which ``SchedulerConfig`` parses), its help from ``HELP`` (registry names
from the registries) plus where a value not given comes from, and no default
of its own: a value not given leaves the base configuration's.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import typer

from autellix.cli.common import fail, one_of
from autellix.core.config import BALANCERS, POLICIES, ConfigError, SchedulerConfig

#: What each option says, for every field of SchedulerConfig (tests/test_cli.py checks).
HELP: dict[str, str] = {
    "policy": one_of(POLICIES),
    "boundaries": "Queue boundaries in seconds of service, e.g. 0.5,2,8,32",
    "quanta": "Steps per queue, e.g. 64,128,256,512,inf",
    "beta": "Anti-starvation ratio, inf disables",
    "backlog_factor": "Promote a program that waits this many times longer than the backlog's programs (>= 1)",
    "balancer": one_of(BALANCERS),
    "long_prompt_tokens": "Calls with more prompt tokens than this stick to their program's engine",
    "program_idle_ttl": "Seconds without a call after which a program is dropped",
    "multi_step": "Re-plan the queues every N steps",
    "max_preemptions": "Engine: running calls preempted per step for better-ranked waiting ones (0: never)",
}
#: Lower bounds the option checks itself (SchedulerConfig checks the rest).
MIN: dict[str, int] = {"multi_step": 1, "max_preemptions": 0}
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

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("overrides")
        options = [inspect.Parameter(
            name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
            annotation=Annotated[option_type(name) | None, typer.Option(
                help=option_help(name, defaults=defaults, text=texts.get(name)), min=MIN.get(name))])
            for name in names]

        @functools.wraps(command)
        def with_overrides(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            return command(*args, overrides=SchedulerOverrides(given), **kwargs)

        exposed = signature.replace(parameters=[*params[:at], *options, *params[at + 1:]])
        with_overrides.__signature__ = exposed  # type: ignore[attr-defined]  # what typer reads
        with_overrides.scheduler_options = names  # type: ignore[attr-defined]  # what the command exposes
        with_overrides.__annotations__ = {p.name: p.annotation for p in exposed.parameters.values()} | {
            "return": signature.return_annotation}
        return with_overrides

    return decorate


__all__ = ["FROM_ENV", "HELP", "MIN", "NO_OVERRIDES", "SchedulerOverrides", "option_help", "option_type",
           "scheduler_options"]
