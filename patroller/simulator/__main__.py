"""`python -m patroller.simulator [--scenario FILE] <nvidia-smi arguments>`: the fake
nvidia-smi."""

from patroller.simulator.program import main

raise SystemExit(main())
