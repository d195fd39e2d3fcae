"""`python -m patroller` starts the daemon."""
from .main import main

raise SystemExit(main())
