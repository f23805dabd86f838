"""EgressRecord.from_data: the record to_data gave comes back, field by field, and nothing else does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstrun.errors import ProxyError
from firstrun.policy.decision import DecisionLayer, Reason, Verdict
from firstrun.policy.network import Channel
from firstrun.proxy.records import Capture, EgressRecord, Scheme, TunnelEnd, tunnel_cut

_text = st.text(max_size=20)

pytestmark = pytest.mark.fast


@st.composite
def records(draw: st.DrawFn) -> EgressRecord:
    return EgressRecord(
        ts=draw(_text), id=draw(_text), channel=draw(st.sampled_from(Channel)),
        method=draw(st.none() | _text), scheme=draw(st.none() | st.sampled_from(Scheme)),
        host=draw(st.none() | _text), port=draw(st.none() | st.integers(0, 65535)),
        path=draw(st.none() | _text), decision=draw(st.sampled_from(Verdict)),
        reason=draw(st.sampled_from(Reason)), layer=draw(st.sampled_from(DecisionLayer)),
        would_deny=draw(st.none() | st.sampled_from(Reason)),
        override=draw(st.none() | _text), resolved=draw(st.none() | _text),
        status=draw(st.none() | st.integers(100, 599)),
        bytes_up=draw(st.integers(0, 1 << 40)), bytes_down=draw(st.integers(0, 1 << 40)),
        duration_ms=draw(st.floats(0, 1e9, allow_nan=False)),
        credentials=tuple(draw(st.lists(_text, max_size=3))),
        capture=draw(st.sampled_from(Capture)),
        ended=draw(st.none() | st.sampled_from(TunnelEnd)),
    )


@given(records())
def test_a_record_round_trips_through_its_data_and_its_json_line(record: EgressRecord) -> None:
    assert EgressRecord.from_data(record.to_data()) == record
    # The sidecar's form: one JSON line, as the docker backend reads it.
    assert EgressRecord.from_data(json.loads(record.to_json())) == record


@given(records(), st.sampled_from(["channel", "scheme", "decision", "reason", "layer",
                                   "would_deny", "capture", "ended"]))
def test_an_unknown_enum_value_is_refused(record: EgressRecord, name: str) -> None:
    with pytest.raises(ProxyError):
        EgressRecord.from_data(dict(record.to_data(), **{name: "maybe"}))


@given(records(), st.sampled_from([n for n in EgressRecord.__dataclass_fields__
                                   if n not in ("credentials", "unrecorded", "capture", "ended")]))
def test_a_missing_field_is_refused(record: EgressRecord, name: str) -> None:
    data = {k: v for k, v in record.to_data().items() if k != name}
    with pytest.raises(ProxyError):
        EgressRecord.from_data(data)


def test_credentials_default_to_none_and_must_be_a_list_of_names() -> None:
    data = EgressRecord(
        ts="t", id="r1", channel=Channel.SHELL, method="GET", scheme=Scheme.HTTP,
        host="pypi.org", port=80, path="/", decision=Verdict.ALLOW, reason=Reason.ALLOWED_BY_LIST,
        layer=DecisionLayer.DEFAULT, would_deny=None, override=None, resolved="1.2.3.4", status=200,
        bytes_up=1, bytes_down=2, duration_ms=1.0).to_data()
    assert EgressRecord.from_data({k: v for k, v in data.items()
                                   if k != "credentials"}).credentials == ()
    with pytest.raises(ProxyError):
        EgressRecord.from_data(dict(data, credentials=[1]))
    with pytest.raises(ProxyError):
        EgressRecord.from_data(dict(data, credentials="TOKEN"))


@pytest.mark.parametrize(("ended", "bytes_down", "cut"), [
    (None, 0, False),
    (TunnelEnd.CLIENT_CLOSED, 0, False),
    (TunnelEnd.CLIENT_CLOSED, 5000, False),
    (TunnelEnd.UPSTREAM_CLOSED, 0, True),
    (TunnelEnd.UPSTREAM_CLOSED, 5000, False),
    (TunnelEnd.CLIENT_RESET, 0, True),
    (TunnelEnd.CLIENT_RESET, 5000, False),
    (TunnelEnd.UPSTREAM_RESET, 0, True),
    (TunnelEnd.UPSTREAM_RESET, 5000, True),
    (TunnelEnd.PROXY_FAILED, 0, True),
    (TunnelEnd.REFUSED, 0, False),
    (TunnelEnd.PROXY_STOPPED, 0, False),
])
def test_a_tunnel_is_cut_by_how_it_ended_and_what_came_down(
        ended: TunnelEnd | None, bytes_down: int, cut: bool) -> None:
    assert tunnel_cut(ended, bytes_down) is cut


def test_only_a_tunnels_data_says_how_it_ended_and_whether_it_was_cut() -> None:
    record = EgressRecord(
        ts="t", id="r1", channel=Channel.SHELL, method="CONNECT", scheme=Scheme.HTTPS_TUNNEL,
        host="pypi.org", port=443, path=None, decision=Verdict.ALLOW,
        reason=Reason.ALLOWED_BY_LIST, layer=DecisionLayer.DEFAULT, would_deny=None,
        override=None, resolved="1.2.3.4", status=200, bytes_up=517, bytes_down=0,
        duration_ms=1.0)
    assert "ended" not in record.to_data() and "cut" not in record.to_data()
    data = EgressRecord.from_data(dict(record.to_data(), ended="upstream_closed")).to_data()
    assert (data["ended"], data["cut"]) == ("upstream_closed", True)
