import sys

from qcc.cli import main

sys.exit(main())
