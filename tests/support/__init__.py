"""What more than one test directory shares, imported as ``support`` (tests/ is on sys.path
through its conftest): the ``workspace`` fixture and the greeter site's run configs
(``fixtures``, a plugin of the root conftest), the profile maker (``profiles``), the scripted
vendor servers and their wire formats (``vendor``, ``*_wire``, ``agents``), and the
interrupt and bad-input helpers (``interrupt``, ``badinput``)."""
