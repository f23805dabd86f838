"""A failed check after the boundary cut a shell tunnel is the boundary's, never docs_gap."""

from __future__ import annotations

import pytest

from firstrun.agents.base import AgentStop
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.network import Channel
from firstrun.proxy.records import EgressRecord, Scheme, TunnelEnd
from firstrun.results.model import EVIDENTIAL
from firstrun.results.model import Classification as C
from firstrun.run.classify import RunReason as R
from firstrun.run.classify import classify_run
from firstrun.run.events import AgentFinished, CheckFinished, CommandRan, Egress, Source

pytestmark = pytest.mark.fast


def tunnel(ended: TunnelEnd, *, down: int, channel: Channel = Channel.SHELL) -> Egress:
    # The data a proxy's record gives, as the run's events carry it.
    return Egress(record=EgressRecord(
        ts="t", id="r", channel=channel, method="CONNECT", scheme=Scheme.HTTPS_TUNNEL,
        host="registry.npmjs.org", port=443, path=None, decision=Verdict.ALLOW,
        reason=Reason.ALLOWED_BY_LIST, layer=DecisionLayer.ALLOWLIST, would_deny=None,
        override=None, resolved="203.0.113.9", status=200, bytes_up=517, bytes_down=down,
        duration_ms=1.0, ended=ended))


def run(*egress: Egress, code: int) -> list:
    return [CommandRan(source=Source.AGENT, command="npm install", exit_code=1, duration_s=1.0),
            *egress, AgentFinished(stop=AgentStop.STEP_FAILED), CheckFinished(exit_code=code)]


def test_a_failure_after_a_cut_tunnel_is_infra_error_and_not_evidence() -> None:
    for cut in (tunnel(TunnelEnd.UPSTREAM_CLOSED, down=0), tunnel(TunnelEnd.PROXY_FAILED, down=0),
                tunnel(TunnelEnd.UPSTREAM_RESET, down=1400)):
        outcome = classify_run(run(tunnel(TunnelEnd.UPSTREAM_CLOSED, down=9000), cut, code=1))
        assert (outcome.classification, outcome.reason) == (C.INFRA_ERROR, R.TUNNEL_CUT)
        assert outcome.classification not in EVIDENTIAL


def test_tunnels_that_ended_well_leave_the_failure_to_the_docs() -> None:
    outcome = classify_run(run(tunnel(TunnelEnd.UPSTREAM_CLOSED, down=9000),
                               tunnel(TunnelEnd.CLIENT_CLOSED, down=0),
                               tunnel(TunnelEnd.PROXY_STOPPED, down=0), code=1))
    assert (outcome.classification, outcome.reason) == (C.DOCS_GAP, R.REPLAY_STEP_FAILED)


def test_a_passing_check_passes_whatever_was_cut_and_a_docs_tunnel_decides_nothing() -> None:
    assert classify_run(run(tunnel(TunnelEnd.PROXY_FAILED, down=0), code=0)).classification \
        is C.PASSED
    docs = tunnel(TunnelEnd.UPSTREAM_RESET, down=0, channel=Channel.DOCS)
    assert classify_run(run(docs, code=1)).classification is C.DOCS_GAP
