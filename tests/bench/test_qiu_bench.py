"""The Qiu-vs-jaxcore ES benchmark runs (quick shapes), and the torch reference of Qiu et al.'s Algorithm 1 does
what the paper says: noise in place while a member generates, removed afterwards, and the update
theta += alpha / N * sum_n z_n eps_n with eps_n regenerated from the member's seed."""

import math

import numpy as np
import pytest
import torch

from jaxcore.bench import BenchOptions

U = 2.0 ** -24          # float32 unit roundoff


def test_quick_bench_reports_times_and_rewards(tmp_path):
    from jaxcore.bench.qiu import run

    out = run(BenchOptions(quick=True, workdir=str(tmp_path)))
    assert out["qiu.iteration_s"] > 0 and out["qiu.jax_iteration_s"] > 0
    assert out["qiu.jax_speedup"] == pytest.approx(out["qiu.iteration_s"] / out["qiu.jax_iteration_s"], rel=0.01)
    assert len(out["qiu.rewards"]) == len(out["qiu.jax_rewards"]) == 1
    assert all(math.isfinite(r) for r in out["qiu.rewards"] + out["qiu.jax_rewards"])
    import jax

    # population 4, rounded up to a multiple of the simulated devices for jaxcore's mesh (both sides run it)
    step = math.lcm(2, jax.device_count())
    assert out["qiu.shape"]["population"] == -(-4 // step) * step and out["qiu.shape"]["new_tokens"] == 4
    assert out["qiu.model"]["layers"] == 2 and out["qiu.device"]["device"].startswith("cpu")
    # what a user waits for: jaxcore's same job as a whole run in a fresh process, against Qiu's load + iterations
    assert out["qiu.jax_whole_run_s"] > out["qiu.jax_time_to_first_step_s"] > 0
    assert out["qiu.whole_run_s"] > out["qiu.load_s"] > 0
    assert out["qiu.jax_over_qiu_whole_run"] == pytest.approx(out["qiu.jax_whole_run_s"] / out["qiu.whole_run_s"],
                                                              rel=0.01)
    for key in ("qiu.reward_time", "qiu.jax_reward_time"):
        times, rewards = out[key]
        assert len(times) == len(rewards) == 1 and times[0] > 0 and math.isfinite(rewards[0])
    assert out["qiu.jax_making_programs"]["programs"] > 0
    png = tmp_path / "qiu_reward_vs_time.png"
    assert out["qiu.reward_vs_time_png"] == str(png) and png.stat().st_size > 0


def _eps(shape: torch.Size, seed: int) -> torch.Tensor:
    """The paper's per-tensor noise, written out independently: a fresh generator seeded with the member seed."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float32).double()


def _run_iteration(tiny_dir, sigma: float, alpha: float, population: int = 4):
    from jaxcore.hf.tokenization import load_tokenizer
    from torchref.model import load_reference
    from torchref.qiu_es import qiu_iteration

    path = tiny_dir("llama")
    model, tokenizer = load_reference(path), load_tokenizer(path)
    before = {k: p.detach().double().clone() for k, p in model.named_parameters()}
    during: list[dict[str, torch.Tensor]] = []

    def reward_fn(completions):          # rewards 0, 1, 2, ... by member: z-scores far from 0, whatever the text
        during.append({k: p.detach().double().clone() for k, p in model.named_parameters()})
        return [float(len(during) - 1)] * len(completions)

    out = qiu_iteration(model, tokenizer, ["12+34=", "5+6="], reward_fn, population=population, sigma=sigma,
                        alpha=alpha, max_new_tokens=3, seed=7)
    after = {k: p.detach().double() for k, p in model.named_parameters()}
    return out, before, during, after


def test_reference_update_is_alpha_over_n_sum_z_eps(tiny_dir):
    n, sigma, alpha = 4, 0.01, 0.05
    out, before, during, after = _run_iteration(tiny_dir, sigma, alpha, n)
    seeds = out["seeds"]
    assert len(set(seeds)) == n and out["rewards"] == [0.0, 1.0, 2.0, 3.0]
    r = np.arange(n, dtype=np.float64)
    z = (r - r.mean()) / (r.std() + 1e-8)
    np.testing.assert_allclose(out["z"], z, rtol=1e-12)
    worst_update, worst_excess = 0.0, 0.0
    for name, w0 in before.items():
        eps = [_eps(w0.shape, s) for s in seeds]
        e_max = torch.stack(eps).abs().amax(0)
        # while member m generated, its noise was in place (up to the rounding of the in-place add)
        for m, snapshot in enumerate(during):
            torch.testing.assert_close(snapshot[name], w0 + sigma * eps[m], rtol=0, atol=4 * U * float(
                (w0.abs() + sigma * e_max).max()) * (m + 1) * 2)
        weighted = sum(float(zn) * e for zn, e in zip(z, eps))
        expected = w0 + alpha / n * weighted
        # float32 rounding: 2 in-place adds per member (perturb, restore), the update's N-term accumulation
        # and its final add; nothing else may differ
        sum_abs = sum(abs(float(zn)) * e.abs() for zn, e in zip(z, eps))
        bound = (2 * n * U * (w0.abs() + sigma * e_max) + alpha / n * (n + 2) * U * sum_abs
                 + U * (w0.abs() + alpha / n * sum_abs))
        excess = ((after[name] - expected).abs() - 2 * bound).max().item()
        assert excess <= 0, f"{name}: off the expected update by {excess} beyond float32 rounding"
        worst_update = max(worst_update, (expected - w0).abs().max().item())
        worst_excess = max(worst_excess, (after[name] - expected).abs().max().item())
    assert worst_update > 1e3 * worst_excess          # the check is not vacuous: the update dwarfs the rounding


def test_reference_restores_weights_up_to_rounding(tiny_dir):
    n, sigma = 4, 0.01
    out, before, _, after = _run_iteration(tiny_dir, sigma, alpha=0.0, population=n)
    drift = 0.0
    for name, w0 in before.items():
        e_max = torch.stack([_eps(w0.shape, s) for s in out["seeds"]]).abs().amax(0)
        diff = (after[name] - w0).abs()
        # at most 2N float32 roundings of |w| + sigma * |eps| (one per in-place add and subtract)
        assert bool((diff <= 2 * n * U * (w0.abs() + sigma * e_max) + 1e-30).all()), name
        drift = max(drift, diff.max().item())
    assert drift < 1e-6
