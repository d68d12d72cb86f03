"""A process of `test_async_processes.py`: `jaxcore grpo ARGS` with `grpo.asynchronous`, gloo collectives on
loopback, 8 CPU devices over PROCESSES processes. With 2, under the multi-process start-up: process 0 trains on its 4
devices, process 1 generates on its 4. With 1, the one-process run on 8 devices (4 + 4), under the same collectives
(`jax.distributed` with one process: its devices' reductions then sum in gloo's order, as the training process's
do). Every `ProcessSync` is watched: its syncs, the weights each moved, the collective-permutes of its compiled
program, and any array the main thread read back to the host during a sync. Writes what it saw to
OUT/process<rank>.json.

    python async_two_processes.py OUT PORT RANK PROCESSES ARGS_JSON
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path


def main(out: str, port: int, rank: int, processes: int, args: list[str]) -> None:
    import jax

    if processes == 1:           # the run's own start-up (`distributed:`) stays off: a one-process run
        jax.distributed.initialize(f"localhost:{port}", 1, 0)
        distributed = []
    else:
        distributed = [f"distributed.coordinator=localhost:{port}", f"distributed.num_processes={processes}",
                       f"distributed.process_id={rank}"]
    from jax._src.array import ArrayImpl

    from jaxcore.cli import main as cli
    from jaxcore.grpo import async_transfer

    syncs: list[async_transfer.ProcessSync] = []
    host_reads: list[str] = []
    pushing = threading.local()
    value = ArrayImpl._value

    def watched_value(self):
        if getattr(pushing, "on", False):
            host_reads.append(str(self.shape))
        return value.fget(self)

    push = async_transfer.ProcessSync.push

    def watched_push(self, params):
        if self not in syncs:
            syncs.append(self)
        pushing.on = True               # this thread only: the rollout worker reads its batches meanwhile
        try:
            return push(self, params)
        finally:
            pushing.on = False

    ArrayImpl._value = property(watched_value)
    async_transfer.ProcessSync.push = watched_push
    code = cli(["grpo", *args, *distributed])
    Path(out, f"process{rank}.json").write_text(json.dumps({
        "code": code, "process_index": jax.process_index(), "local_devices": jax.local_device_count(),
        "syncs": [s.syncs for s in syncs], "transfers": [s.transfers for s in syncs],
        "permutes": [s.permutes() for s in syncs], "host_reads": host_reads}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]))
