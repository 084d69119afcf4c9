"""`python -m mooncake.tools ...` runs the `mooncake` command (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
