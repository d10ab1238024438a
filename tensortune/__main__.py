"""`python -m tensortune ...`: works with no script on PATH at all."""
import sys

from tensortune.cli import main

if __name__ == "__main__":   # not again in a worker process that imports the parent's main module
    sys.exit(main())
