"""`python -m compactd` is the `compactd` command."""

import sys

from compactd.app.cli import main

sys.exit(main())
