"""The `goodput` command: every promised command exists, has --help, and unbuilt ones say so."""

from __future__ import annotations

import subprocess

import pytest

from goodput_cli.main import EXPECTED, build_parser, main
from tests.support import goodput_command


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_design_command_has_help(path, capsys):
    # argparse exits 0 after printing help; a missing command would exit 2 with "invalid choice".
    with pytest.raises(SystemExit) as exc:
        main([*path.split(), "--help"])
    assert exc.value.code == 0
    assert "usage: goodput" in capsys.readouterr().out


def test_every_command_module_loads():
    # A provider that raises on import would otherwise only show up as "unavailable" at run time.
    from goodput_cli import main as cli

    cli.build_parser()
    assert cli.PROVIDER_FAILURES == {}


def test_unknown_command_exits_2():
    proc = subprocess.run(goodput_command("no-such-command"), capture_output=True, text=True)
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


def test_unbuilt_command_says_so_in_one_line(capsys):
    import argparse

    from goodput_cli.main import _not_built

    # An unbuilt command is never a silent stub: one line naming the issue, exit status 2.
    assert _not_built("simulate", 6, {})(argparse.Namespace()) == 2
    assert capsys.readouterr().err == "goodput simulate: not built yet (issue #6)\n"
    # When a command module failed to load, the message says that instead of "not built".
    assert _not_built("simulate", 6, {"forecaster.cli": "SyntaxError: bad"})(argparse.Namespace()) == 1
    assert "failed to load (forecaster.cli: SyntaxError: bad)" in capsys.readouterr().err
