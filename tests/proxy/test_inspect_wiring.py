"""--inspect-tls from the task file and the command line down to the proxy and the sandbox.

The run test talks to the real registries (reachable from this machine
through its own TLS-intercepting proxy, whose CA is in the system store):
only reads leave; the upload is refused by firstrun's proxy before a byte
of it goes upstream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.errors import TaskError, UsageError
from firstrun.policy.decision import Reason
from firstrun.policy.filesystem import FilesystemPolicy
from firstrun.policy.profile import SandboxProfile
from firstrun.tasks.compile import compile_network_policy
from firstrun.tasks.load import load_task

FIRSTRUN = Path(sys.executable).parent / "firstrun"
DOCS = Path(__file__).parents[1] / "support" / "greeter_docs"
DOCS_HOST = "docs.greeter.test"

CREDENTIALS = """\
firstrun:
  methods:
    - host: upload.example.com
      methods: [POST, PUT]
      path: /api/
  credentials:
    - name: NPM_TOKEN
      host: registry.example.com
      from_env: NPM_TOKEN_REAL
"""


def _task(tmp_path: Path, extra: str = "", *, replay: tuple[str, ...] = ("true",),
          success: str = "test -f done") -> Path:
    steps = "".join(f"  - {{run: {json.dumps(step)}, undocumented: a test step}}\n" for step in replay)
    path = tmp_path / "inspect.yaml"
    path.write_text(
        f"name: inspect\ngoal: Fetch a package.\ndocs:\n  entrypoint: http://{DOCS_HOST}/\n"
        f"replay:\n{steps}success:\n  script: {json.dumps(success)}\n{extra}",
        encoding="utf-8")
    return path


def test_a_credential_without_inspection_is_refused_naming_the_task(tmp_path: Path) -> None:
    task = load_task(_task(tmp_path, CREDENTIALS))
    with pytest.raises(UsageError, match=r"inspect\.yaml: firstrun\.credentials \(NPM_TOKEN\) "
                                         r"need --inspect-tls"):
        compile_network_policy(task)


def test_inspection_carries_the_task_rules_and_changes_the_policy_hash(tmp_path: Path) -> None:
    task = load_task(_task(tmp_path, CREDENTIALS))
    policy = compile_network_policy(task, inspect=True)
    assert policy.inspection is not None
    assert policy.inspection.to_data() == {
        "rules": [{"host": "upload.example.com", "methods": ["POST", "PUT"], "path_prefix": "/api/"}],
        "credentials": [{"name": "NPM_TOKEN", "host": "registry.example.com",
                         "from_env": "NPM_TOKEN_REAL"}],
        "max_body_bytes": 1 << 20,
    }
    (tmp_path / "plain").mkdir()
    plain = load_task(_task(tmp_path / "plain", ""))
    fs = FilesystemPolicy(workspace="/ws")
    hashes = {SandboxProfile(fs=fs, net=p).policy_hash()
              for p in (compile_network_policy(plain), compile_network_policy(plain, inspect=True))}
    assert len(hashes) == 2


@pytest.mark.parametrize("entry, key", [
    ("  credentials:\n    - name: PATH\n      host: a.example\n      from_env: X\n", "name"),
    ("  credentials:\n    - name: NPM-TOKEN\n      host: a.example\n      from_env: X\n", "name"),
    ("  methods:\n    - host: a.example\n      methods: [CONNECT]\n", "methods"),
])
def test_a_bad_entry_is_refused_at_load_naming_its_line(tmp_path: Path, entry: str,
                                                        key: str) -> None:
    path = _task(tmp_path, "firstrun:\n" + entry)
    with pytest.raises(TaskError) as caught:
        load_task(path)
    assert f"{path}:" in str(caught.value)


def test_inspection_on_a_backend_that_cannot_show_the_bundle_is_a_usage_error() -> None:
    result = subprocess.run(
        [str(FIRSTRUN), "sandbox", "--backend", "local", "--inspect-tls", "--", "true"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [(
        "firstrun: error: --backend local: --inspect-tls needs the docker or linux or gvisor "
        "backend; the "
        "local backend cannot show the run's CA bundle in its sandbox")]


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["linux", "docker"])
def test_a_run_with_inspection_installs_from_the_registry_and_cannot_upload(
    tmp_path: Path, backend: str,
) -> None:
    from firstrun.agents import ReplayAgent
    from firstrun.docs import Mirror
    from firstrun.results.model import Classification
    from firstrun.run.events import Egress, read_trace
    from firstrun.run.runner import RunConfig, run_task

    task = load_task(_task(
        tmp_path,
        replay=("pip download --no-deps --no-cache-dir -d dl six==1.16.0",
                ("curl -sS -o /dev/null -w '%{http_code}' -X POST --data-binary x "
                 "https://pypi.org/legacy/ > upload.status")),
        success="ls dl/six-1.16.0-*.whl && test \"$(cat upload.status)\" = 405",
    ))
    config = RunConfig(out_dir=tmp_path / "out", backend=backend, inspect_tls=True,
                       docs_mirrors={DOCS_HOST: Mirror(host=DOCS_HOST, directory=str(DOCS))})
    record = run_task(task, attempt=1, agent=ReplayAgent(), config=config)
    assert record.classification is Classification.PASSED, record
    inner = [e["record"] for e in read_trace(tmp_path / "out" / record.trace)
             if e["kind"] == Egress.kind]
    refused = [r for r in inner if r.get("reason") == Reason.METHOD_NOT_ALLOWED.value]
    assert [(r["method"], r["host"], r["path"]) for r in refused] == [
        ("POST", "pypi.org", "/legacy/")]
    assert any(r.get("scheme") == "https" and r.get("host") == "files.pythonhosted.org"
               and r.get("method") == "GET" and r.get("status") == 200 for r in inner)


@pytest.mark.parametrize("flags, env, message", [
    ((), {}, "firstrun.credentials (NPM_TOKEN) need --inspect-tls"),
    (("--inspect-tls",), {}, "credential NPM_TOKEN: $NPM_TOKEN_REAL is not set"),
])
def test_run_refuses_a_credential_it_cannot_honour_before_any_run(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str], message: str,
) -> None:
    task = _task(tmp_path, CREDENTIALS)
    result = subprocess.run(
        [str(FIRSTRUN), "run", str(task), *flags, "--out", str(tmp_path / "out"),
         "--docs-mirror", f"{DOCS_HOST}={DOCS}"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if k != "NPM_TOKEN_REAL"} | env)
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"firstrun: error: {task}: {message}")
    assert not (tmp_path / "out" / "runs").exists()
