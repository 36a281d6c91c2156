"""`python -m parity.html_report --screenshot HTML PNG`: the command's name; the code is parity.report.html."""

import sys

from parity.report.html import main

if __name__ == "__main__":
    sys.exit(main())
