import sys

from diagnose.present.cli import main

sys.exit(main())
