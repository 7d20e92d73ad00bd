"""The one entry point, `goodput`.

Each package owns its commands in its own `cli.py` and adds them through `register(registry)`.
Commands that DESIGN.md lists but no package has registered yet still appear in `--help`; run,
they say in one line that the capability is not built yet and exit 2 (never a silent stub).
Heavy imports (torch, statsmodels) happen inside the command functions, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

from goodput_cli.errors import UsageError

# Command groups that hold subcommands (`goodput engine serve`, `goodput bench engine`, ...).
GROUPS = {
    "engine": "the bundled inference engine",
    "sidecar": "the measuring proxy",
    "forecaster": "the forecaster and External Metrics API",
    "forecast": "forecast accuracy tools",
    "bench": "performance benchmarks",
    "dashboards": "Grafana dashboards",
    "rules": "Prometheus alerting and recording rules",
}

# Every command DESIGN.md promises, with the issue that builds it.
EXPECTED = {
    "demo": ("the embedded default: engine + sidecar + forecaster, replays a real trace", 4),
    "engine serve": ("serve the bundled engine (OpenAI-compatible)", 3),
    "sidecar run": ("run the measuring proxy in front of an upstream", 9),
    "forecaster run": ("run the forecaster and External Metrics API", 5),
    "load": ("open-loop load against any OpenAI endpoint", 4),
    "sweep": ("offered-load sweep with goodput curve and knee", 4),
    "forecast backtest": ("forecast accuracy on a trace", 5),
    "simulate": ("autoscaling policies replayed on a trace", 6),
    "dashboards generate": ("write the Grafana dashboards JSON", 7),
    "dashboards preview": ("render dashboard panels from a live Prometheus to PNG", 7),
    "rules generate": ("write the alerting and recording rules", 7),
    "bench engine": ("engine performance against its floors and transformers", 3),
    "bench sidecar": ("what the sidecar adds: open loop, beside a bare relay and LiteLLM's proxy", 9),
    "advise": ("prompt-layout advice from request records or a trace (offline)", 18),
}

# Modules that register commands; a module that does not exist yet is skipped.
PROVIDERS = [
    "engine.cli",
    "sidecar.cli",
    "forecaster.cli",
    "forecaster.simulate.cli",
    "dashboards.cli",
    "sidecar.loadgen.cli",
    "sidecar.advise_cli",
    "goodput_cli.demo",
    "goodput_cli.soak",
]


class Registry:
    """Hands out argument parsers for command paths like "engine serve" or "load"."""

    def __init__(self, top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]):
        self._top = top
        self._groups = groups
        self.registered: set[str] = set()

    def command(self, path: str, help: str, func: Callable[[argparse.Namespace], int | None]) -> argparse.ArgumentParser:
        words = path.split()
        if len(words) == 1:
            parent = self._top
        elif len(words) == 2 and words[0] in self._groups:
            parent = self._groups[words[0]]
        else:
            raise ValueError(f"command path {path!r} must be one word or '<group> <name>' with group in {sorted(self._groups)}")
        parser = parent.add_parser(words[-1], help=help, description=help)
        parser.set_defaults(func=func)
        self.registered.add(path)
        return parser


def _not_built(path: str, issue: int, failures: dict[str, str]) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        if failures:
            # A provider that failed to load may be the one owning this command: say so, not "not built".
            detail = "; ".join(f"{mod}: {err}" for mod, err in failures.items())
            print(f"goodput {path}: unavailable, a command module failed to load ({detail})", file=sys.stderr)
            return 1
        print(f"goodput {path}: not built yet (issue #{issue})", file=sys.stderr)
        return 2

    return run


# Import failures of providers, by module; tests assert it stays empty.
PROVIDER_FAILURES: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput",
        description="Observability and autoscaling sidecar for LLM serving.",
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    top.required = True
    groups = {}
    for name, help in GROUPS.items():
        group_parser = top.add_parser(name, help=help, description=help)
        sub = group_parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
        sub.required = True
        groups[name] = sub
    registry = Registry(top, groups)
    PROVIDER_FAILURES.clear()
    for module_name in PROVIDERS:
        try:
            module = importlib.import_module(module_name)
            module.register(registry)
        except ModuleNotFoundError as exc:
            # "That provider does not exist yet" is expected while the project grows.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            PROVIDER_FAILURES[module_name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001  one broken module must not take every command down
            PROVIDER_FAILURES[module_name] = f"{type(exc).__name__}: {exc}"
    for path, (help, issue) in EXPECTED.items():
        if path not in registry.registered:
            registry.command(path, f"{help} [not built yet]", _not_built(path, issue, PROVIDER_FAILURES))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UsageError as exc:
        print(f"goodput: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("goodput: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
