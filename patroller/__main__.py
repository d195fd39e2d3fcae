"""`python -m patroller` starts the daemon."""

from patroller.main import main

raise SystemExit(main())
