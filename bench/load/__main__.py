"""``python -m bench.load``: ``bench.load.run``: the command its make target and results name."""

import sys

from bench.load.run import main

sys.exit(main())
