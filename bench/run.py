"""``python -m bench.run``: the simulator sweep (``bench.sweep.run``), under the command ``make bench`` and
``make bench-quick`` name and ``frontier.json`` records."""

import sys

from bench.sweep.run import main

if __name__ == "__main__":
    sys.exit(main())
