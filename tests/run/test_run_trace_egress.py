"""An egress event holds its record typed; the trace writes the record's data form, unchanged."""

from __future__ import annotations

from pathlib import Path

from egress_support import egress_record
from firstrun.proxy.records import EgressRecord, TunnelEnd
from firstrun.run.events import Egress, Trace, read_trace


def test_the_trace_line_is_the_record_s_data_and_parses_back_to_the_same_record(
        tmp_path: Path) -> None:
    record = egress_record(decision="allow", reason="allowed_by_list", status=200,
                           bytes_down=9000, ended="upstream_closed", credentials=["TOKEN"])
    assert record.ended is TunnelEnd.UPSTREAM_CLOSED
    trace = Trace(tmp_path / "trace.jsonl")
    try:
        trace.emit(Egress(record=record))
    finally:
        trace.close()
    (line,) = read_trace(tmp_path / "trace.jsonl")
    assert line["kind"] == "egress"
    # The saved form is the proxy's record line, ``cut`` included, as traces always held.
    assert line["record"] == record.to_data()
    assert line["record"]["cut"] is False
    assert EgressRecord.from_data(line["record"]) == record
    assert trace.events() == [Egress(record=record)]
