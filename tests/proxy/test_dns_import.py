"""dnspython (about 0.1 s to import) is imported only by a proxy that opens a DNS listener,
and then beside the sandbox's start, in a thread of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

_SCRIPT = """
import sys
import firstrun.proxy.server as server
from firstrun.policy.network import Channel, NetworkPolicy
print("after import:", "dns.message" in sys.modules)
with server.EgressProxy(NetworkPolicy.build()) as proxy:
    proxy.listen_tcp(Channel.SHELL)
    print("proxy listener:", "dns.message" in sys.modules)
    proxy.listen_tcp(Channel.SHELL, kind=server.ListenerKind.DNS)
    import threading
    for thread in threading.enumerate():
        if thread.name == "firstrun-dns-preload":
            thread.join(60)
    print("dns listener:", "dns.message" in sys.modules)
"""


def test_dnspython_is_imported_only_for_a_dns_listener_and_in_the_background() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["after import: False", "proxy listener: False",
                                        "dns listener: True"]
