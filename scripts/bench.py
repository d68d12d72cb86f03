"""Benchmarks as ratios against references measured in the same run.

usage:
  python scripts/bench.py --suite all --json runs/bench.json
  python scripts/bench.py --suite generate,es --dtype bfloat16 --preset smollm2-135m   # on a GPU

Same as `jaxcore bench ...`; results are recorded in docs/benchmarks.md.
"""

import sys

from jaxcore.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
