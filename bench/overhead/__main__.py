"""``python -m bench.overhead``: ``bench.overhead.run``: the command its make target and results name."""

import sys

from bench.overhead.run import main

sys.exit(main())
