import sys

from lad.cli import main

sys.exit(main())
