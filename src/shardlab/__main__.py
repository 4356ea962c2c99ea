"""``python -m shardlab`` runs the command line."""

from shardlab.cli import main

raise SystemExit(main())
