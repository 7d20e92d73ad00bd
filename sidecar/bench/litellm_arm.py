"""LiteLLM's proxy as a benchmark arm: installed on demand into its own venv, run offline.

LiteLLM is never a dependency of this project: `goodput bench sidecar` creates
`$GOODPUT_CACHE/litellm-venv` (default `~/.cache/goodput/litellm-venv`) the first time and
installs `litellm[proxy]` there with pip. Where the package index cannot serve the `proxy`
extra whole (its `litellm-proxy*` parts of the same release are missing from some mirrors), the
extra's other requirements are installed beside `litellm` and the proxy module is imported to
check that it works.
Anything that fails makes the arm *missing* with the reason; the benchmark goes on without it.

The proxy is configured with one model entry pointing at the scripted upstream
(`openai/scripted`, `api_base` = the upstream's /v1) and started with
`LITELLM_LOCAL_MODEL_COST_MAP=True` so that it does not fetch its cost map from the internet.
It runs the way its docs start it (`litellm --config ...`, one uvicorn worker), logging at
ERROR so that per-request log lines do not count against it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sidecar.bench.arms import Proc, free_port

LITELLM_VERSION = os.environ.get("GOODPUT_LITELLM_VERSION", "1.110.2")
_MARKER = ".goodput-installed"
# Offline: the bundled cost map, no telemetry, no proxy for loopback, one log line per error only.
_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
        "NO_PROXY": "*", "no_proxy": "*"}
_CHECK = "import litellm, litellm.proxy.proxy_server; print(litellm.__name__)"


class Unavailable(Exception):
    """LiteLLM could not be installed or started; the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get("GOODPUT_CACHE") or Path.home() / ".cache" / "goodput").expanduser()


def venv_dir() -> Path:
    return cache_dir() / "litellm-venv"


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("WARNING")]
    return lines[-1][:300] if lines else "no output"


def ensure_installed(progress=print) -> Path:
    """The venv's python with a working LiteLLM proxy; raises Unavailable with the reason."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    if marker.exists() and marker.read_text().strip() == LITELLM_VERSION and python.exists():
        return python
    progress(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once; a few minutes)")
    try:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        whole = _pip(python, f"litellm[proxy]=={LITELLM_VERSION}")
        if whole.returncode != 0:
            # Install litellm, then the proxy extra's requirements that the index does have.
            base = _pip(python, f"litellm=={LITELLM_VERSION}")
            if base.returncode != 0:
                raise Unavailable(f"pip cannot install litellm=={LITELLM_VERSION}: {_last_line(base.stderr)}")
            reqs = _proxy_requirements(python)
            extra = _pip(python, *reqs) if reqs else None
            if extra is not None and extra.returncode != 0:
                raise Unavailable(f"pip cannot install litellm's proxy requirements: {_last_line(extra.stderr)}")
        check = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, timeout=300,
                               env={**os.environ, **_ENV})
        if check.returncode != 0:
            raise Unavailable(f"litellm's proxy does not import: {_last_line(check.stderr)}")
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"installing litellm timed out ({exc.cmd[2] if len(exc.cmd) > 2 else exc.cmd})") from None
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Unavailable(f"cannot create {venv}: {exc}") from None
    marker.write_text(LITELLM_VERSION + "\n")
    return python


def _proxy_requirements(python: Path) -> list[str]:
    """The `proxy` extra's requirements as the installed litellm declares them, minus LiteLLM's
    own `litellm-*` packages pinned to the same release (`litellm-proxy`, `-proxy-extras`,
    `-enterprise`: the pieces a lagging index lacks; the proxy module ships inside litellm too)."""
    script = ("import importlib.metadata as m\n"
              "from packaging.requirements import Requirement\n"
              "for r in m.requires('litellm') or ():\n"
              "    q = Requirement(r)\n"
              "    if q.marker and q.marker.evaluate({'extra': 'proxy'}) and not q.name.startswith('litellm-'):\n"
              "        q.marker = None\n"
              "        print(q)\n")
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        _pip(python, "packaging")
        out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def config_text(upstream_url: str) -> str:
    return ("model_list:\n"
            "  - model_name: scripted\n"
            "    litellm_params:\n"
            "      model: openai/scripted\n"
            f"      api_base: {upstream_url}/v1\n"
            "      api_key: x\n"
            "litellm_settings:\n"
            "  drop_params: true\n"
            "  telemetry: false\n")


def start(upstream_url: str, cores: tuple[int, ...], api_key: str, progress=print) -> tuple[Proc, str]:
    """Start the proxy in front of `upstream_url`: (process, base URL). Raises Unavailable.
    `api_key` becomes its master key (it refuses to start without a strong one); the load
    client sends it to every arm alike."""
    python = ensure_installed(progress)
    folder = Path(tempfile.mkdtemp(prefix="goodput-litellm-"))
    cfg = folder / "config.yaml"
    cfg.write_text(config_text(upstream_url))
    port = free_port()
    argv = [str(python), "-c", "from litellm.proxy.proxy_cli import run_server; run_server()",
            "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    try:
        proc = Proc("litellm proxy", argv, f"http://127.0.0.1:{port}/health/liveliness", cores, env={**_ENV, "LITELLM_MASTER_KEY": api_key}, timeout=180)
    except (RuntimeError, TimeoutError) as exc:
        raise Unavailable(f"litellm's proxy did not start: {str(exc)[-400:]}") from None
    return proc, f"http://127.0.0.1:{port}"
