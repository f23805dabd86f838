"""The run's docs reader, made beside the session's start: what making it raised is raised
where the run waits for it, and what was made is closed on the way out either way."""

from __future__ import annotations

import pytest

from firstrun.docs import DocsReader, Politeness
from firstrun.run.sandbox import _Made

pytestmark = pytest.mark.fast


def _reader() -> DocsReader:
    return DocsReader(allow=(), proxy=("127.0.0.1", 9), cache_dir=None, user_agent="test",
                      politeness=Politeness(), min_delay_s=0.0, mirrors={})


def test_the_reader_made_is_the_one_closed() -> None:
    made = _Made(_reader)
    reader = made.result()
    assert not reader._client.is_closed
    made.close()
    assert reader._client.is_closed


def test_what_making_it_raised_is_raised_where_the_run_waits() -> None:
    def broken() -> DocsReader:
        raise OSError("no CA store")

    made = _Made(broken)
    with pytest.raises(OSError, match="no CA store"):
        made.result()
    made.close()  # nothing was made, nothing to close
