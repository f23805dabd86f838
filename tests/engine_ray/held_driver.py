"""A Ray sweep's driver whose run answers after the stop, though its command died before.

Run as ``python held_driver.py ADDRESS TASK OUT DOCS_HOST DOCS_DIR`` with TOKEN in
``HELD_TOKEN`` (in argv it would name this process too), in a process of its
own so that Ray reads this environment when it is imported.
The run's command (``exec -a TOKEN``) is killed as a Ctrl-C's signal would
kill it; the driver holds the node's answer until the stop is set, and sets
the stop only once the command is gone (``interrupt_support``). Exits 0 when
the sweep kept no record, 1 when it kept one.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from firstrun.docs import Mirror  # noqa: E402
from firstrun.results.store import ResultsStore  # noqa: E402
from firstrun.run import ray_engine  # noqa: E402
from firstrun.run.events import Event, RunFinished  # noqa: E402
from firstrun.run.runner import RunConfig  # noqa: E402
from firstrun.run.suite import run_suite  # noqa: E402
from firstrun.tasks.load import load_task  # noqa: E402
from support.interrupt import kill_then_stop  # noqa: E402


def main(address: str, task: str, out: str, host: str, docs: str) -> int:
    token = os.environ["HELD_TOKEN"]
    mirrors = {host: Mirror(host=host, directory=docs)}
    config = RunConfig(out_dir=Path(out), backend="linux", docs_mirrors=mirrors)
    stop, held = threading.Event(), threading.Event()

    def on_event(name: str, attempt: int, event: Event) -> None:
        # The node's answer is in; hold it until the stop is set.
        if isinstance(event, RunFinished):
            held.set()
            stop.wait(120)

    joined = ray_engine.Cluster.join(address)
    try:
        joined.probe("linux", allow_unenforced=False, images=[None], needs_kernel=False)
        engine = joined.engine(agent="replay", model=None, base_url=None, prices=None,
                               mirrors=mirrors)
        interrupt = kill_then_stop(token, held, stop)
        try:
            outcome = run_suite([load_task(task)], engine=engine, config=config,
                                store=ResultsStore(config.out_dir, meta={}), workers=1,
                                stop=stop, on_event=on_event)
        finally:
            held.set()
            interrupt.join()
    finally:
        ray_engine.leave()
    return 0 if outcome.interrupted and outcome.records == [] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
