"""The fake backend: a run's plumbing with no boundary, so agent and run tests need no kernel.

Guarantee: it never passes for a sandbox. As with ``local``, it refuses to start unless
unenforced runs were allowed (``--allow-unenforced``), and ``auto`` never picks it. Every
session says it is fake: backend ``fake``, enforcement UNENFORCED, every layer not applied,
and one attestation check, failed, saying that nothing was proven. Commands run on the host
in the workspace with ``local``'s hygiene, and the proxy variables name a loopback relay to
the harness proxy. So the records and refusals of egress that honours them are real.
"""

from __future__ import annotations

from firstrun.errors import SandboxUnavailable
from firstrun.policy.profile import LayerName, SandboxProfile
from firstrun.sandbox.base import (
    Check,
    Enforcement,
    LayerStatus,
    ProxyEndpoint,
    SessionInfo,
)
from firstrun.sandbox.local import LocalBackend, LocalSession
from firstrun.sandbox.seatbelt.relay import ProxyRelay

# Said in every session's attestation and layers, so no result can read as enforced.
NOTHING_ENFORCED = ("FAKE BACKEND: nothing is enforced and nothing was attested; commands run "
                    "on the host as the harness's user (for tests only)")


class FakeBackend(LocalBackend):
    name = "fake"
    detail = "a fake for tests: commands run on the host, with no boundary"
    refusal_fix = ("pass --allow-unenforced to run on the fake backend, which enforces "
                   "nothing, and accept that it is recorded")

    def start(self, profile: SandboxProfile, *, proxy: ProxyEndpoint | None) -> LocalSession:
        self.refuse_unless_allowed()
        # Refused rather than ignored: a run that asked for them would read as if it had them.
        if proxy is not None and (proxy.trust_bundle is not None or proxy.captures):
            raise SandboxUnavailable("the fake backend can neither inspect TLS nor capture "
                                     "transparently", who=self.name,
                                     fix="use --backend linux for --inspect-tls or capture")
        info = SessionInfo(
            backend=self.name, enforcement=Enforcement.UNENFORCED,
            policy_hash=profile.policy_hash(),
            layers=tuple(LayerStatus(name=layer, applied=False, mechanism="none",
                                     detail=NOTHING_ENFORCED) for layer in LayerName),
            attestation=(Check(name="fake_backend_enforces_nothing", passed=False,
                               detail=NOTHING_ENFORCED),),
            downgrades=tuple(sorted(profile.required)))
        if proxy is None or not proxy.socket_path:
            return LocalSession(profile, info)
        relay = ProxyRelay(proxy.socket_path)
        try:
            return LocalSession(profile, info, proxy_url=f"http://127.0.0.1:{relay.port}",
                                on_close=relay.close)
        except BaseException:
            relay.close()
            raise
