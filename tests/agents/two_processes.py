"""One of the two processes of `test_two_processes.py`: the counting episode (`counting.py`) of 8 rows sharded over
2 processes x 2 CPU devices, each row's environment recording which process reset and called it; then the rows
scored by a TRL reward function that reads `environments` (`trl_tools.counted`). Writes what it saw to
OUT/process<rank>.json.

    python two_processes.py MODEL_DIR OUT PORT RANK
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trl_tools

RECORDS: list[tuple[str, int, int]] = []        # (event, process index, row) of every environment call here
ROWS = 8


class RecordingEnv(trl_tools.IncrementEnv):
    """TRL's counter, recording each reset and tool call with the process that ran it and the row's `row`."""

    def reset(self, **kwargs) -> str | None:
        import jax

        self.row = kwargs["row"]
        RECORDS.append(("reset", jax.process_index(), self.row))
        return super().reset(**kwargs)

    def increment(self, step: int) -> int:     # the tool's schema: IncrementEnv.increment's docstring (inherited)
        import jax

        RECORDS.append(("increment", jax.process_index(), self.row))
        return super().increment(step)


def main(model_dir: str, out: str, port: int, rank: int) -> None:
    from jaxcore.parallel.meshes import maybe_initialize_distributed

    maybe_initialize_distributed(f"localhost:{port}", 2, rank)

    import jax
    import numpy as np

    from jaxcore.agents import Agent, run_episodes
    from jaxcore.agents.environments import Environments, resolve_factories
    from jaxcore.agents.tools import load_tools
    from jaxcore.hf.model_checkpoint import load_any
    from jaxcore.hf.tokenization import load_tokenizer
    from jaxcore.parallel import meshes, rows, sharding
    from jaxcore.rewards import Example, Scorer
    from jaxcore.rewards.user_functions import TRLReward
    from jaxcore.runtime.config import RolloutConfig
    from jaxcore.runtime.rollout import score_rows

    model, _ = load_any(model_dir, "float32")
    tokenizer = load_tokenizer(model_dir)
    mesh = meshes.grpo_mesh(1)
    sharding.replicate_model(model, mesh)
    agent = Agent(load_tools([trl_tools.add]), Environments(resolve_factories(RecordingEnv)), max_episode_tokens=128)
    examples = [Example("Count to 2.", answer=2, columns={"row": i}) for i in range(ROWS)]
    episodes = run_episodes(agent, model, tokenizer, examples, RolloutConfig(max_new_tokens=72, temperature=1.0),
                            key=jax.random.key(0), eos_token_ids=(tokenizer.eos_token_id,),
                            pad_token_id=tokenizer.pad_token_id, row_sharding=meshes.leading_axis(mesh, meshes.DATA))
    with Scorer({"counted": TRLReward("counted", fn=trl_tools.counted)}) as scorer:
        scores = score_rows(episodes.result, examples, tokenizer, scorer, environments=episodes.instances)
    Path(out, f"process{rank}.json").write_text(json.dumps({
        "records": RECORDS, "owned": [r for r, inst in enumerate(episodes.instances) if inst is not None],
        "prompt_ids": episodes.prompt_ids_BT.tolist(), "tokens": rows.gather_rows(episodes.result.tokens).tolist(),
        "lengths": rows.gather_rows(episodes.result.lengths).tolist(), "model_mask": episodes.model_mask_BE.tolist(),
        "calls": episodes.tool_calls_B.tolist(), "counted": scores.per_function["counted"].tolist(),
        "env_reward": [None if np.isnan(v) else v for v in episodes.env_rewards["RecordingEnv"].tolist()]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
