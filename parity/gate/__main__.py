import sys

from parity.gate.run import main

sys.exit(main())
