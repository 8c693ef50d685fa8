"""`python -m tupe ...` (and `torchrun -m tupe ...`) run the command-line interface."""

import sys

from tupe.cli import main

if __name__ == "__main__":
    sys.exit(main())
