"""`python -m servelab`."""

from servelab.cli import main

raise SystemExit(main())
