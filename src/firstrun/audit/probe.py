"""The audit's in-session probe: one action, attempted for real, and what the kernel answered.

Guarantee: each action is a real attempt made from inside the session as an
ordinary command, and the probe reports what happened (the errno, the value
read back), never what it expected, as one JSON object on stdout:
``{"done": bool, "detail": str}``. It sends nothing anywhere but this host's
own addresses and the session's proxy; an action that could only be
attempted by leaving this machine is not attempted.
"""

from __future__ import annotations

# Runs as ``python -I -S -c <this source> <params json>`` with the workspace as
# its working directory: stdlib only, because inside a sandbox there is only
# the interpreter's own installation.
import ctypes
import errno
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time

_CLONE_NEWUSER = 0x10000000
_PTRACE_ATTACH = 16
_PTRACE_DETACH = 17
_SYS_IO_URING_SETUP = 425

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _err(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def _proxy() -> tuple[str, int] | None:
    url = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
    if not url:
        return None
    hostport = url.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def _registry_base(p: dict) -> str:
    """The registry's URL by the session's own route: its name through the proxy, else its address."""
    host = p["registry_host"] if _proxy() is not None else p["registry_ip"]
    return f"https://{host}:{p['registry_port']}"


def _http(p: dict, method: str, path: str, *, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> str:
    """One HTTPS request to the allowed registry, verified against the session's trust.

    Through the proxy the tunnel names the registry, and so does the SNI
    (http.client sends the tunnel's host); a ``Host`` in ``headers`` replaces
    the one http.client would send, which is all domain fronting needs. A
    refusal's reason, when the proxy gave one, follows the status.
    """
    context = ssl.create_default_context(cafile=p["cafile"])
    proxy = _proxy()
    if proxy is not None:
        conn = http.client.HTTPSConnection(*proxy, timeout=10, context=context)
        conn.set_tunnel(p["registry_host"], p["registry_port"])
    else:
        conn = http.client.HTTPSConnection(p["registry_ip"], p["registry_port"], timeout=10,
                                           context=context)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        reason = response.getheader("X-Firstrun-Reason")
        return f"HTTP {response.status}" + (f" {reason}" if reason else "")
    except OSError as exc:
        return f"{type(exc).__name__}: {_err(exc.errno) if exc.errno else exc}"
    finally:
        conn.close()


def _connect(family: int, address: object) -> str:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(address)
    except OSError as exc:
        return _err(exc.errno) if exc.errno else str(exc)
    finally:
        s.close()
    return "connected"


def write_workspace(p: dict) -> tuple[bool, str]:
    with open(p["write_path"], "w") as f:
        f.write(p["nonce"])
    return True, "written"


def run_test(p: dict) -> tuple[bool, str]:
    with open("test_firstrun_audit.py", "w") as f:
        f.write(
            "import unittest\n"
            "class T(unittest.TestCase):\n"
            "    def test_runs(self):\n"
            f"        open({p['test_path']!r}, 'w').write({p['nonce']!r})\n"
        )
    # Not -I: the test module is found on the working directory, as a project's are.
    out = subprocess.run([sys.executable, "-m", "unittest", "-q", "test_firstrun_audit"],
                         check=False, capture_output=True, text=True, timeout=60)
    return out.returncode == 0, f"unittest exit {out.returncode}: {out.stderr.strip()[-200:]}"


def install_package(p: dict) -> tuple[bool, str]:
    # requests lets REQUESTS_CA_BUNDLE override pip's --cert, so both name the file.
    cafile = os.path.abspath(p["cafile"])
    env = {**os.environ, "PIP_CERT": cafile, "REQUESTS_CA_BUNDLE": cafile}
    out = subprocess.run(
        [sys.executable, "-I", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
         "--no-input", "--target", p["site_path"], "--index-url", f"{_registry_base(p)}/simple/",
         "--cert", cafile, p["package"]],
        env=env, check=False, capture_output=True, text=True, timeout=120)
    return out.returncode == 0, f"pip exit {out.returncode}: {out.stderr.strip()[-300:]}"


def read_home_secret(p: dict) -> tuple[bool, str]:
    try:
        with open(p["secret_path"]) as f:
            return True, f.read()
    except OSError as exc:
        return False, _err(exc.errno)


def write_system_file(p: dict) -> tuple[bool, str]:
    try:
        with open(p["system_path"], "w") as f:
            f.write(p["nonce"])
    except OSError as exc:
        return False, _err(exc.errno)
    return True, "written"


def write_protected_entry(p: dict) -> tuple[bool, str]:
    try:
        with open(p["protected_path"], "w", encoding="utf-8") as f:
            f.write(p["nonce"])
    except OSError as exc:
        return False, _err(exc.errno)
    return True, "rewritten"


def fill_disk(p: dict) -> tuple[bool, str]:
    chunk = b"\xa5" * (1 << 20)
    written = 0
    try:
        with open(p["fill_path"], "wb", buffering=0) as f:
            while written < p["fill_bytes"]:
                written += f.write(chunk) or 0
            os.fsync(f.fileno())
    except OSError as exc:
        return False, f"{_err(exc.errno)} after {written >> 20} MiB"
    return True, f"wrote {written >> 20} MiB"


def leave_process(p: dict) -> tuple[bool, str]:
    # setsid and a double fork: out of the command's session and process group.
    subprocess.Popen(["/bin/bash", "-c", f"exec -a {p['token']} sleep 600"],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return True, "started"


def read_host_environ(p: dict) -> tuple[bool, str]:
    try:
        with open(f"/proc/{p['environ_pid']}/environ", "rb") as f:
            return True, f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError as exc:
        return False, _err(exc.errno)


def kill_host_process(p: dict) -> tuple[bool, str]:
    try:
        os.kill(p["kill_pid"], signal.SIGKILL)
    except OSError as exc:
        return False, _err(exc.errno)
    return True, "signalled"


def create_user_namespace(p: dict) -> tuple[bool, str]:
    # In a child: the probe itself stays in its namespaces.
    pid = os.fork()
    if pid == 0:
        rc = _libc.unshare(_CLONE_NEWUSER)
        os._exit(0 if rc == 0 else min(ctypes.get_errno(), 255) or 255)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code == 0, "unshare(CLONE_NEWUSER): " + ("succeeded" if code == 0 else _err(code))


def mount(p: dict) -> tuple[bool, str]:
    target = os.path.abspath(p["mount_path"])
    os.makedirs(target, exist_ok=True)
    rc = _libc.mount(b"firstrun-audit", target.encode(), b"tmpfs", 0, None)
    if rc != 0:
        return False, "mount: " + _err(ctypes.get_errno())
    _libc.umount2(target.encode(), 0)
    return True, "mount: succeeded (unmounted again)"


def io_uring(p: dict) -> tuple[bool, str]:
    params = ctypes.create_string_buffer(120)
    fd = _libc.syscall(_SYS_IO_URING_SETUP, ctypes.c_uint(1), params)
    if fd < 0:
        return False, "io_uring_setup: " + _err(ctypes.get_errno())
    os.close(fd)
    return True, "io_uring_setup: an io_uring fd"


def ptrace_sibling(p: dict) -> tuple[bool, str]:
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        _libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        if _libc.ptrace(_PTRACE_ATTACH, child.pid, None, None) != 0:
            return False, "PTRACE_ATTACH: " + _err(ctypes.get_errno())
        time.sleep(0.1)
        with open(f"/proc/{child.pid}/status") as f:
            tracer = next(line.split()[1] for line in f if line.startswith("TracerPid:"))
        _libc.ptrace(_PTRACE_DETACH, child.pid, None, None)
        return tracer == str(os.getpid()), f"PTRACE_ATTACH: succeeded, TracerPid {tracer}"
    finally:
        child.kill()
        child.wait()


def lower_oom_score(p: dict) -> tuple[bool, str]:
    path = "/proc/self/oom_score_adj"
    with open(path) as f:
        before = int(f.read())
    target = before - 1
    try:
        with open(path, "w") as f:
            f.write(str(target))
    except OSError as exc:
        return False, f"{before} -> {target}: {_err(exc.errno)}"
    with open(path) as f:
        after = int(f.read())
    return after == target, f"{before} -> {after}"


def host_abstract_socket(p: dict) -> tuple[bool, str]:
    result = _connect(socket.AF_UNIX, "\0" + p["abstract_name"])
    return result == "connected", result


def host_loopback(p: dict) -> tuple[bool, str]:
    # The host as this session can address it: its loopback, or a docker bridge's address.
    direct = _connect(socket.AF_INET, (p["canary_host"], p["canary_port"]))
    proxy = _proxy()
    via = "no proxy"
    if proxy is not None:
        conn = http.client.HTTPConnection(*proxy, timeout=10)
        try:
            conn.request("GET", f"http://{p['canary_host']}:{p['canary_port']}/")
            via = f"HTTP {conn.getresponse().status}"
        except OSError as exc:
            via = _err(exc.errno) if exc.errno else str(exc)
        finally:
            conn.close()
    return direct == "connected", f"direct: {direct}; via the proxy: {via}"


def raw_ip(p: dict) -> tuple[bool, str]:
    # Not verified: a command going around the proxy does not care whom it reaches.
    conn = http.client.HTTPSConnection(p["registry_ip"], p["registry_port"], timeout=5,
                                       context=ssl._create_unverified_context())
    try:
        conn.request("GET", p["raw_ip_path"])
        return True, f"HTTP {conn.getresponse().status}"
    except OSError as exc:
        return False, _err(exc.errno) if exc.errno else str(exc)
    finally:
        conn.close()


def resolve_name(p: dict) -> tuple[bool, str]:
    label = p["dns_label"].encode()
    query = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
             + bytes([len(label)]) + label + b"\x07example\x00\x00\x01\x00\x01")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(query, (p["canary_host"], p["dns_port"]))
    except OSError as exc:
        return False, _err(exc.errno)
    finally:
        s.close()
    return True, "query sent"


def cloud_metadata(p: dict) -> tuple[bool, str]:
    proxy = _proxy()
    if proxy is None:
        return False, "not attempted: without a proxy it would leave this machine"
    conn = http.client.HTTPConnection(*proxy, timeout=10)
    try:
        conn.request("GET", "http://169.254.169.254/latest/meta-data/")
        status = conn.getresponse().status
    except OSError as exc:
        return False, _err(exc.errno) if exc.errno else str(exc)
    finally:
        conn.close()
    return status < 400, f"HTTP {status} from the proxy"


def upload_registry(p: dict) -> tuple[bool, str]:
    result = _http(p, "POST", "/upload", body=p["nonce"].encode(),
                   headers={"Content-Type": "application/octet-stream"})
    return result == "HTTP 200", result


def credential_elsewhere(p: dict) -> tuple[bool, str]:
    token = os.environ.get(p["credential_variable"], "")
    result = _http(p, "GET", "/simple/", headers={"Authorization": f"Bearer {token}"})
    return result == "HTTP 200", result


def domain_fronting(p: dict) -> tuple[bool, str]:
    # The CONNECT and the SNI name the allowed registry; only the Host names
    # the other tenant, which a CDN behind that name would route on. The
    # registry answers the unknown path 404; a refusal by the proxy names its reason.
    result = _http(p, "GET", p["fronted_path"], headers={"Host": p["fronted_host"]})
    return result == "HTTP 404", result


ACTIONS = {f.__name__: f for f in (
    write_workspace, run_test, install_package, read_home_secret, write_system_file,
    write_protected_entry, fill_disk, leave_process, read_host_environ, kill_host_process, create_user_namespace, mount,
    io_uring, ptrace_sibling, lower_oom_score, host_abstract_socket, host_loopback, raw_ip,
    resolve_name, cloud_metadata, upload_registry, credential_elsewhere, domain_fronting,
)}


# The harness judges each action by its own evidence wherever the host can see
# one (a canary's connection count, a file's contents, a process still alive);
# what this prints is the evidence only for the kernel interfaces no host-side
# witness can observe (a namespace, a mount, an io_uring, a ptrace, a score
# write), and the report says so.
def main(argv: list[str]) -> int:
    params = json.loads(argv[1])
    try:
        done, detail = ACTIONS[params["action"]](params)
    except OSError as exc:
        done, detail = False, f"{type(exc).__name__}: {_err(exc.errno) if exc.errno else exc}"
    json.dump({"done": done, "detail": detail}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
