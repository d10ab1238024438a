"""`python -m tensortune ...`: works with no script on PATH at all."""
import sys

from tensortune.cli import main

sys.exit(main())
