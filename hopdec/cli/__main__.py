"""``python -m hopdec.cli ...`` is the ``hopdec`` command (what the launch scripts and tests run)."""

import sys

from hopdec.cli.main import main

sys.exit(main())
