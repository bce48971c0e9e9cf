"""`kvtier bench` with the engine option max_stores_in_flight_while_loading set to $CAP: the
harness of docs/PERFORMANCE.md section 29. The fs tier accepts the option; `kvtier bench`
has no flag for it, so every engine this process opens gets it here.

    CAP=1 python docs/perf/store-cap/capbench.py --root /tmp --sizes 256K,2M ...
"""

import os
import sys

from kvtier import _core

CAP = int(os.environ["CAP"])


class CappedEngine(_core.Engine):
    def __init__(self, *args, **kwargs):
        # Set, not defaulted: the storage options pass the engine its default explicitly.
        kwargs["max_stores_in_flight_while_loading"] = CAP
        super().__init__(*args, **kwargs)


_core.Engine = CappedEngine

from kvtier.cli import main  # noqa: E402  (after the engine is replaced)

sys.exit(main(["bench", *sys.argv[1:]]))
