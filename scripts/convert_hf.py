"""Convert between an HF model directory and a jaxcore (orbax) checkpoint.

usage:
  python scripts/convert_hf.py --from-hf ./SmolLM2-135M --out ./ckpt/smollm2
  python scripts/convert_hf.py --to-hf ./ckpt/smollm2 --out ./exported [--dtype bfloat16]

Same as `jaxcore convert ...`.
"""

import sys

from jaxcore.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
