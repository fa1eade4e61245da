"""``python -m bench.live``: ``bench.live.run``: the command its make target and results name."""

import sys

from bench.live.run import main

sys.exit(main())
