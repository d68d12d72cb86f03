"""The host allocator policy the jaxcore command and trainers set (`jaxcore.runtime.host_allocator`): XLA:CPU's
buffers stay mapped between program runs, so a run does not page-fault its working set anew. Counted (page
faults), never timed. Importing jaxcore sets nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")

# A program with a 256 MiB temporary ([8192, 8192] float32), run three times after its compilation; prints
# whether the policy was applied and the minor page faults of each later run.
PROGRAM = """
import json, resource
import jaxcore
jaxcore.keep_freed_host_memory()
import jax, jax.numpy as jnp
from jaxcore.runtime import host_allocator

@jax.jit
def f(x):
    return ((x @ x.T) @ x).sum()

x = jnp.ones((8192, 64))
f(x).block_until_ready()
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": host_allocator.applied, "faults": faults}))
"""
TEMP_PAGES = 8192 * 8192 * 4 // 4096


def run_program(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM], env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_program_run_reuses_its_temporaries_pages():
    """With the policy, a run after the first faults on none of its 256 MiB temporary (glibc's defaults map
    and unmap it on every run: ~65,000 faults each)."""
    got = run_program()
    assert got["applied"]
    assert max(got["faults"]) < TEMP_PAGES // 20, got


def test_system_allocator_opt_out_leaves_glibc_as_it_is():
    """`JAXCORE_HOST_MALLOC=system` keeps glibc's defaults, and there every run faults on its temporary again
    (which is what the test above would see without the policy)."""
    got = run_program(JAXCORE_HOST_MALLOC="system")
    assert not got["applied"]
    assert min(got["faults"]) > TEMP_PAGES // 2, got


def test_nothing_is_claimed_once_a_backend_runs():
    """After the first JAX computation XLA's threads have their arenas: the call changes nothing and says so."""
    import jax.numpy as jnp

    from jaxcore.runtime import host_allocator

    jnp.ones(2).block_until_ready()
    assert host_allocator.backend_running()
    assert not host_allocator.keep_freed_host_memory()


def test_a_misspelt_choice_is_named_in_a_warning():
    out = subprocess.run([sys.executable, "-m", "jaxcore.cli", "--help"], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAXCORE_HOST_MALLOC": "sytem"}, timeout=120)
    assert "JAXCORE_HOST_MALLOC='sytem' is neither 'keep' nor 'system'" in out.stderr


@pytest.mark.parametrize("code, applied", [
    ("import jaxcore, jaxcore.api, jaxcore.trl", False),       # importing runs nothing
    ("import jaxcore.api; jaxcore.api.ESTrainer()", True),      # a trainer sets it before its first JAX work
    ("from jaxcore.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass", True),
])
def test_the_policy_is_set_by_the_command_and_the_trainers_not_by_importing(code, applied):
    script = f"{code}\nfrom jaxcore.runtime import host_allocator\nprint(host_allocator.applied)"
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == str(applied), out.stderr[-2000:]
