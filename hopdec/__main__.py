"""``python -m hopdec ...`` is the ``hopdec`` command, as ``python -m hopdec.cli`` is (for machines where the
``hopdec`` script is not on PATH: ``mpirun -n 4 python -m hopdec train``)."""

import sys

from hopdec.cli.main import main

sys.exit(main())
