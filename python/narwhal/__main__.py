"""``python -m narwhal``: the same as the ``narwhal`` command."""

import sys

from narwhal.cli import main

sys.exit(main())
