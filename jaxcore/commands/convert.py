"""Convert an HF model directory to a jaxcore (orbax) checkpoint, or back.

examples:
  jaxcore convert --from-hf ./SmolLM2-135M --out ./ckpt/smollm2
  jaxcore convert --to-hf ./ckpt/smollm2 --out ./exported --dtype bfloat16
  jaxcore convert --from-gguf ./SmolLM2-135M-Instruct.Q4_1.gguf --out ./smollm2-hf   # needs `pip install gguf`

--out is written to a temporary sibling and renamed into place when complete. It must not be (or contain, or
lie inside) the input; an existing non-empty --out is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="HF directory (config.json + safetensors)")
    source.add_argument("--to-hf", metavar="CKPT", help="jaxcore checkpoint directory")
    source.add_argument("--from-gguf", metavar="FILE", help="GGUF file (llama.cpp/Ollama) -> HF directory, dequantized")
    parser.add_argument("--out", required=True, help="output directory (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="--to-hf only: tensor dtype of the export (default: the source's)")


def run(args: argparse.Namespace) -> int:
    from jaxcore.hf.convert import load_hf, save_hf
    from jaxcore.hf.model_checkpoint import load_model, save_model, tokenizer_dir
    from jaxcore.model.state import flat_state
    from jaxcore.outputs import check_output

    source = args.from_gguf or args.from_hf or args.to_hf
    check_output(args.out, inputs=(source,), overwrite=args.overwrite, name="--out")   # before reading anything
    if args.from_gguf:
        from jaxcore.hf.gguf import gguf_to_hf

        out = gguf_to_hf(args.from_gguf, args.out, overwrite=args.overwrite)
        model = load_hf(out)                                # checks the mapping is strict-complete
    elif args.from_hf:
        model = load_hf(args.from_hf)
        out = save_model(model, args.out, tokenizer_dir=args.from_hf, overwrite=args.overwrite,
                         inputs=(args.from_hf,))
    else:
        model = load_model(args.to_hf)
        out = save_hf(model, args.out, tokenizer_dir=tokenizer_dir(args.to_hf), dtype=args.dtype,
                      overwrite=args.overwrite, inputs=(args.to_hf,))
    n_params = sum(int(v.size) for v in flat_state(model).values())
    print(f"wrote {out} ({model.config.family}, {n_params / 1e6:.2f}M parameters)")
    return 0
