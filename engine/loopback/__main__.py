"""`python -m engine.loopback --port 8080 ...`: the loopback server standalone
(the same as `tulving serve-loopback`; options in engine/loopback/cli.py)."""
import sys

from engine.loopback.cli import main

sys.exit(main())
