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
    parser = build_parser()
    # Find a command whose provider has not registered a real implementation, if any remains.
    unbuilt = [p for p in EXPECTED if "[not built yet]" in _help_of(parser, p)]
    if not unbuilt:
        pytest.skip("every command is built")
    code = main(unbuilt[0].split())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "not built yet" in err[0]


def _help_of(parser, path: str) -> str:
    sub = parser
    for word in path.split():
        action = next(a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction")
        sub = action.choices[word]
    return sub.description or ""
