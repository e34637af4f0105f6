import sys

from asyncspec.cli import main

sys.exit(main())
