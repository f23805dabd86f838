"""``python -m firstrun.proxy HOST PORT``: the sidecar entry point (see ``sidecar``)."""

import sys

from firstrun.proxy.sidecar import main

sys.exit(main(sys.argv[1:]))
