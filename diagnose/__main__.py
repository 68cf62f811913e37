import sys

from diagnose.present.cli import entry

sys.exit(entry())
