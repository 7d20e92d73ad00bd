"""Child server processes that wait until they answer and always stop (demo and tests share it).

`ServerProcess` starts a command in its own process group, keeps its output in a log file (in
`log_dir` as NAME.log, or a temporary file), waits until an HTTP URL answers, and stops the whole
group (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def goodput_command(*args: str) -> list[str]:
    """The `goodput` CLI run with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "goodput_cli", *args]


def _pdeathsig():
    """A preexec_fn asking the kernel for SIGTERM when the parent dies (None where there is no prctl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_it() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)
    return set_it


class ServerProcess:
    """A server subprocess with a log file; use as a context manager or call stop()."""

    def __init__(self, cmd: list[str], ready_url: str | None, *, env: dict[str, str] | None = None,
                 timeout: float = 60.0, name: str | None = None, cwd: str | Path | None = None,
                 die_with_parent: bool = False, log_dir: str | Path | None = None):
        self.cmd = cmd
        self.ready_url = ready_url
        self.name = name or Path(cmd[0]).name
        if log_dir is not None:
            self.log_path = Path(log_dir) / f"{self.name}.log"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "wb")
        else:
            self._log = tempfile.NamedTemporaryFile(prefix=f"goodput-{self.name}-", suffix=".log", delete=False)
            self.log_path = Path(self._log.name)
        full_env = dict(os.environ)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        if env:
            full_env.update(env)
        # A new session so stop() can signal the whole process group.
        # die_with_parent: the kernel sends SIGTERM if this process dies, even by SIGKILL, when no
        # finally block runs (Linux; elsewhere the flag does nothing).
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     cwd=cwd, start_new_session=True,
                                     preexec_fn=_pdeathsig() if die_with_parent else None)
        if ready_url is not None:
            self.wait_ready_url(ready_url, timeout)

    def wait_ready_url(self, url: str, timeout: float) -> None:
        """Wait for `url` to answer; on any failure or interruption (Ctrl-C) the process is stopped."""
        self.ready_url = url
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as resp:
                    if resp.status < 500:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.name} did not answer {self.ready_url} within {timeout:.0f}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self, grace: float = 5.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(grace)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
