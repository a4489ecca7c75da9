"""The training loop of `corral.sdk.example`, runnable from a checkout:

    corral submit train -p team-a -g 1 -- python examples/train.py --steps 200

Read src/corral/sdk/example.py for the loop itself: checkpoint when asked to stop, resume
from the latest checkpoint.
"""

import sys

from corral.sdk.example import main

if __name__ == "__main__":
    sys.exit(main())
