"""`python -m engine.cli ...`: the `tulving` command without the install check."""
import sys

from engine.cli.main import main

sys.exit(main())
