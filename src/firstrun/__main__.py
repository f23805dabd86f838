"""``python -m firstrun``: the same command as the ``firstrun`` script."""

from firstrun.cli.main import main

main()
