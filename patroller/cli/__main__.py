"""`python -m patroller.cli ARGS`: the command line, as `patroller ARGS` runs it."""

from patroller.cli import main

raise SystemExit(main())
