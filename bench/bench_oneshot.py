#!/usr/bin/env python3
"""A one-shot sandbox, ``firstrun sandbox -- true``, against Anthropic's ``srt true``, and where
firstrun's start goes, phase by phase.

Guarantee: both one-shots are fresh processes running ``true``, alternated
over ``ROUNDS`` rounds after one warm-up each, in this one run; each figure
is the median wall time. srt is the version ``scripts/install
--with-bench-deps`` pinned into bench/.peers (it needs ripgrep and socat).
firstrun runs with byte-code caching on, as an installed CLI has it (the
environment's PYTHONDONTWRITEBYTECODE is dropped for it). ``cli_version`` is
``firstrun --version``: the interpreter plus the CLI's own imports, which
every command pays. Two floors are measured in the same rounds:
``python_bare`` (firstrun's interpreter running ``pass``, as ``-I -S``
does: no site, no imports of ours) and ``bwrap_bare`` (bubblewrap with
every namespace firstrun unshares, the host's / bound read-only, running
``true``: no helper, no probe, no proxy). The phases are a one-shot's, in process, over
``ROUNDS`` rounds, each phase's median length: the proxy's start, then
``LinuxBackend.start``'s own marks (``StartPhases``), the first command, the
close and the proxy's stop; so a regression shows in the phase that grew.
Bar: firstrun at most 0.5x srt.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 7
BAR = 0.5
HERE = Path(__file__).resolve().parent
SRT = HERE / ".peers" / "node_modules" / ".bin" / "srt"
FIRSTRUN = Path(sys.executable).parent / "firstrun"
BWRAP_BARE = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
              "--unshare-net", "--unshare-cgroup-try", "--disable-userns", "--die-with-parent",
              "--as-pid-1", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc",
              "--dev", "/dev", "--", "true"]


def _wall_s(argv: list[str], env: dict[str, str], cwd: str) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[-400:]}")
    return took


def _phases(rounds: int) -> dict[str, float]:
    """Median length of each phase of a one-shot's start and end, in seconds, in process.

    The start is ``firstrun sandbox``'s: the egress proxy with transparent
    capture's listeners, then ``LinuxBackend.start``'s own phases; then the
    first command and the close.
    """
    from firstrun.enclosure import ProxySetup, harness_proxy
    from firstrun.policy.network import NetworkPolicy
    from firstrun.policy.profile import SandboxProfile
    from firstrun.sandbox.hostfs import host_filesystem_policy
    from firstrun.sandbox.linux.backend import LinuxBackend

    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        workspace = tempfile.mkdtemp(prefix="firstrun-bench-oneshot-")
        try:
            began = time.perf_counter()
            with harness_proxy(NetworkPolicy.build(), ProxySetup(env=os.environ),
                               captures=True) as made:
                endpoint = made.endpoint
                lengths = {"proxy_started": time.perf_counter() - began}
                profile = SandboxProfile(fs=host_filesystem_policy(workspace, os.environ,
                                                                   protect=False))
                session = LinuxBackend().start(profile, proxy=endpoint)
                try:
                    if session.start_phases is None:
                        raise RuntimeError("the linux session did not profile its start")
                    lengths.update(session.start_phases.durations())
                    t = time.perf_counter()
                    if session.exec(["true"]).exit_code != 0:
                        raise RuntimeError("true failed inside the sandbox")
                    lengths["first_command"] = time.perf_counter() - t
                finally:
                    t = time.perf_counter()
                    session.close()
                    lengths["closed"] = time.perf_counter() - t
                t = time.perf_counter()
            lengths["proxy_stopped"] = time.perf_counter() - t
            for phase, length in lengths.items():
                samples.setdefault(phase, []).append(length)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
    return {phase: statistics.median(lengths) for phase, lengths in samples.items()}


def main(rounds: int = ROUNDS) -> dict[str, dict[str, object]]:
    if not SRT.exists():
        raise RuntimeError(f"srt is not installed at {SRT}: run scripts/install --with-bench-deps")
    for tool in ("rg", "socat"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"srt needs {tool}: run scripts/install --with-bench-deps")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("bubblewrap is not installed: run scripts/install")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    one_shots = {
        "srt_true": [str(SRT), "true"],
        "firstrun_sandbox_true": [str(FIRSTRUN), "sandbox", "--backend", "linux", "--", "true"],
        "cli_version": [str(FIRSTRUN), "--version"],
        "python_bare": [os.path.realpath(sys.executable), "-I", "-S", "-c", "pass"],
        "bwrap_bare": [bwrap, *BWRAP_BARE],
    }
    samples: dict[str, list[float]] = {name: [] for name in one_shots}
    with tempfile.TemporaryDirectory(prefix="firstrun-bench-oneshot-") as cwd:
        for argv in one_shots.values():
            _wall_s(argv, env, cwd)  # warm: byte code written, pages cached
        for _ in range(rounds):
            for name, argv in one_shots.items():
                samples[name].append(_wall_s(argv, env, cwd))
    median = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    figures: dict[str, dict[str, object]] = {
        "srt_true": {"value": median["srt_true"], "unit": "ms", "better": "lower"},
        "firstrun_sandbox_true": {"value": median["firstrun_sandbox_true"], "unit": "ms",
                                  "better": "lower", "baseline": "srt_true", "bar": BAR},
        "cli_version": {"value": median["cli_version"], "unit": "ms", "better": "lower"},
        "python_bare": {"value": median["python_bare"], "unit": "ms", "better": "lower"},
        "bwrap_bare": {"value": median["bwrap_bare"], "unit": "ms", "better": "lower"},
    }
    for phase, length in _phases(rounds).items():
        figures[f"linux_oneshot_{phase}"] = {"value": length * 1e3, "unit": "ms",
                                           "better": "lower"}
    return figures


if __name__ == "__main__":
    result = main()
    for name, fig in result.items():
        print(f"{name:40s} {fig['value']:10.1f} {fig['unit']}")
    ratio = result["firstrun_sandbox_true"]["value"] / result["srt_true"]["value"]  # type: ignore[operator]
    print(f"firstrun / srt: {ratio:.2f}x (bar {BAR}x)")
    sys.exit(0 if ratio <= BAR else 1)
