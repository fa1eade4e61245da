"""``python -m bench.faults``: ``bench.faults.run``: the command its make target and results name."""

import sys

from bench.faults.run import main

sys.exit(main())
