"""RFT: rejection-sampling data generation and LoRA SFT with transformers, peft and the HF Trainer.

    torchref rft-data --out data/rft --train 1000 --valid 100
    torchref rft-datagen --model ./SmolLM2-360M-Instruct --questions data/rft/train.json --out data/rft/rft.json
    torchref rft-train --model ./SmolLM2-360M-Instruct --data data/rft/rft.json --out runs/rft --merge
    torchref rft-eval --model runs/rft/merged --questions data/rft/valid.json

Modules: `data` (question and SFT files), `prompts` (template and chat formatting), `grading`
(answer parsing with the shared numeric reward), `engines` (HF and jaxcore samplers, micro-batching),
`datagen`, `sft_data` (tokenisation with prompt masking), `precision` (device capabilities), `train`,
`evaluate`, `settings` (flags with environment overrides) and `errors`.
"""
