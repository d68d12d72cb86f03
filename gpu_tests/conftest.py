"""The tests that compile for NVIDIA GPUs without one (`make test-gpu-compile`; CI runs them after `make test`).

XLA's CUDA plugin (`make gpu-compile-install`, beside the venv) must load before JAX starts its backends: this
runs before any test module imports JAX.
"""

from jaxcore.bench import gpu_targets

gpu_targets.prepare_environment()
