"""The main job: EGGROLL on a tiny local model, evaluated before/after with transformers.

usage:
  python scripts/demo.py [--epochs 150] [--population 128] [--out runs/demo]

Same as `jaxcore demo ...` (simulates 8 CPU devices when no accelerator is present).
"""

import sys

from jaxcore.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
