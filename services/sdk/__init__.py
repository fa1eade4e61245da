"""The SDK lives in ``chimera_client``, which also installs alone (the ``chimera-client`` distribution,
``clients/python``); this package keeps the imports of the server, the benchmarks and the tests as they
were. New code imports ``chimera_client``."""

from chimera_client import *  # noqa: F403
from chimera_client import __all__ as __all__
