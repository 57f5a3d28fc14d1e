import sys

from farm.cli import main

sys.exit(main())
