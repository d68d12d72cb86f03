"""`jaxcore bench --suite learn` (issue 52): the suite end to end on the tiny bench model with a budget of seconds,
its JSON, the threshold and time-to-threshold as pure functions, evaluation time kept out of the budget (a fake
clock), and one line for an unknown method. No timed assertions."""

from __future__ import annotations

import json

import pytest

from jaxcore.bench import learn
from jaxcore.bench.learn import Budget, peer_checks, summarize, threshold, time_to_reach, versus
from jaxcore.cli import main


def test_the_suite_runs_end_to_end_and_writes_its_json(tmp_path):
    out, png = tmp_path / "learn.json", tmp_path / "curves.png"
    assert main(["bench", "--suite", "learn", "--quick", "--methods", "jaxcore_grpo,rft", "--seeds", "0",
                 "--budget-s", "2", "--eval-every-s", "1", "--json", str(out), "--png", str(png),
                 "--workdir", str(tmp_path / "models")]) == 0
    result = json.loads(out.read_text())
    assert result["learn.methods"] == ["jaxcore_grpo", "rft"] and result["learn.seeds"] == [0]
    for method in ("jaxcore_grpo", "rft"):
        assert 0 <= result[f"learn.best.{method}"] <= 1
        assert f"learn.time_to_threshold_s.{method}" in result          # a number, or null if never reached
        (times, rewards), = result[f"learn.curves.{method}"]
        assert len(times) == len(rewards) >= 2                            # the start, and after the budget
        assert times == sorted(times) and times[-1] >= 2                  # the last one past the budget
        run, = result[f"learn.run.{method}"]
        assert len(run["eval_s"]) == len(times) and result[f"learn.steps.{method}"] == [run["steps"]]
        assert 1 <= len(run["held_out_samples"]) <= 3 and all(isinstance(t, str) for t in run["held_out_samples"])
        assert len(result[f"learn.load_average.{method}"][0]) == 3
    assert result["learn.rft.before"] == result["learn.curves.rft"][0][1][0]
    assert result["learn.rft.after"] == result["learn.curves.rft"][0][1][-1]
    assert "trl_grpo" not in json.dumps({k: v for k, v in result.items() if k.startswith("learn.best")})
    if result["learn.reward_vs_time_png"] is not None:                    # None without matplotlib
        assert png.is_file()


@pytest.mark.parametrize("start, finals, expected", [
    (0.4, [0.6, 0.9, 0.5], 0.65),          # half-way to the best final
    (0.2, [0.2], 0.2),                     # nothing learned: the start itself
    (0.5, [0.3, 0.4], 0.45),               # every method ends below the start: half-way down to the best of them
    (0.0, [1.0, 0.0], 0.5),
])
def test_threshold_is_half_way_from_the_start_to_the_best_final(start, finals, expected):
    assert threshold(start, finals) == pytest.approx(expected)


@pytest.mark.parametrize("times, rewards, level, expected", [
    ([0, 60, 120], [0.4, 0.6, 0.8], 0.6, 60.0),      # reached exactly
    ([0, 60, 120], [0.4, 0.5, 0.7], 0.6, 120.0),
    ([0, 60, 120], [0.4, 0.7, 0.5], 0.6, 60.0),      # the first time, not the last
    ([5, 60], [0.4, 0.5], 0.6, None),                # never
    ([5, 60], [0.7, 0.5], 0.6, 5.0),                 # already at the start
])
def test_time_to_reach(times, rewards, level, expected):
    assert time_to_reach(times, rewards, level) == expected


def test_summary_per_method():
    curves = {"a": [([0, 10, 20], [0.4, 0.6, 0.8]), ([0, 10, 20], [0.4, 0.8, 0.8])],     # finals 0.8: the best
              "b": [([0, 10, 20], [0.4, 0.5, 0.6]), ([0, 10, 20], [0.4, 0.4, 0.4])],     # one seed never reaches
              "c": [([0, 10, 20], [0.4, 0.7, 0.5]), ([0, 10, 20], [0.4, 0.4, 0.65])]}
    got = summarize(curves)
    assert got["learn.start"] == 0.4 and got["learn.threshold"] == 0.6      # 0.4 + (0.8 - 0.4) / 2
    assert got["learn.best.a"] == 0.8 and got["learn.best_spread.a"] == 0
    assert got["learn.best.b"] == 0.5 and got["learn.best_spread.b"] == pytest.approx(0.2)
    assert got["learn.final.c"] == pytest.approx(0.575)
    assert got["learn.time_to_threshold_s.a"] == 10.0 and got["learn.time_to_threshold_s_seeds.a"] == [10.0, 10.0]
    assert got["learn.time_to_threshold_s.b"] is None and got["learn.time_to_threshold_s_seeds.b"] == [20.0, None]
    assert got["learn.time_to_threshold_s.c"] == 15.0


def test_a_method_against_its_peers_best():
    curves = {"fast": [([5, 30, 60], [0.4, 1.0, 1.0]), ([5, 30, 60], [0.4, 0.9, 1.0])],
              "peer": [([5, 60, 120], [0.4, 0.8, 1.0]), ([5, 60, 120], [0.4, 1.0, 1.0])]}
    got = versus(curves, "fast", "peer", 0.5)
    assert got["level"] == 1.0 and got["peer_rose"]                       # the peer's best, mean over its seeds
    assert got["time_s"] == 45.0 and got["peer_time_s"] == 90.0           # (30 + 60) / 2 against (120 + 60) / 2
    assert got["ratio"] == 0.5 and got["met"] is True
    slow = {"slow": [([5, 200], [0.4, 1.0]), ([5, 200], [0.4, 0.9])], "peer": curves["peer"]}
    got = versus(slow, "slow", "peer", 0.5)
    assert got["time_s"] is None and got["ratio"] is None and got["met"] is None   # one seed never reached it


def test_a_peer_that_never_rose_above_its_start_has_no_time_to_beat():
    curves = {"es": [([5, 30], [0.4, 0.45])], "qiu": [([10, 130, 270], [0.4, 0.4, 0.39])]}
    got = versus(curves, "es", "qiu", 0.1)
    assert got["level"] == 0.4 and got["peer_rose"] is False
    assert got["time_s"] == 5.0 and got["peer_time_s"] == 10.0 and got["ratio"] is None and got["met"] is None


def test_the_issues_checks_are_named_by_method_and_peer():
    run = [([5, 60], [0.4, 0.6])]
    every = {m: run for m in learn.METHODS}
    assert set(peer_checks(every)) == {"learn.versus.jaxcore_grpo.trl_grpo", "learn.versus.jaxcore_es.qiu_loop",
                                       "learn.versus.jaxcore_es_qiu.qiu_loop"}
    assert peer_checks({"jaxcore_grpo": run, "rft": run}) == {}            # a check needs both of its methods
    assert peer_checks(every)["learn.versus.jaxcore_es.qiu_loop"]["goal"] == 0.1


class FakeClock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_evaluation_time_is_kept_out_of_the_budget():
    clock = FakeClock(start=3.0)            # 3 s of start-up (imports, loading) before the first evaluation
    budget = Budget(budget_s=10.0, every_s=4.0, clock=clock)

    def evaluation() -> float:
        clock.now += 100.0                  # every evaluation takes 100 s of wall-clock
        return len(budget.curve) / 10

    assert not budget.tick(evaluation)      # the start
    steps = 0
    while True:
        clock.now += 1.5                    # one unit of work
        steps += 1
        if budget.tick(evaluation):
            break
    # training seconds: 3, 4.5, 6, 7.5, 9, 10.5: the marks 0, 4 and 8 are passed at 3, 4.5 and 9, then the budget
    assert [t for t, _, _ in budget.curve] == [3.0, 4.5, 9.0, 10.5]
    assert [r for _, r, _ in budget.curve] == [0.0, 0.1, 0.2, 0.3]
    assert [e for _, _, e in budget.curve] == [100.0] * 4 and budget.eval_s == 400.0
    assert steps == 5 and budget.train_s() == 10.5 and clock.now == 410.5


def test_a_mark_passed_in_one_long_step_is_evaluated_once():
    clock = FakeClock(start=0.0)
    budget = Budget(budget_s=100.0, every_s=10.0, clock=clock)
    budget.tick(lambda: 0.0)
    clock.now = 35.0                        # one step over the marks 10, 20 and 30
    assert not budget.tick(lambda: 1.0)
    clock.now = 39.0                        # before the next mark (40): no evaluation
    budget.tick(lambda: 2.0)
    assert [t for t, _, _ in budget.curve] == [0.0, 35.0]


def test_an_unknown_method_is_one_line(capsys):
    assert main(["bench", "--suite", "learn", "--methods", "jaxcore_grpo,sgd"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown --methods 'sgd'; choose from " + ", ".join(learn.METHODS) in err[0]


def test_every_method_has_settings_and_a_label():
    for method in learn.METHODS:
        assert learn.method_settings(method)["eval_prompts"] == 64 and method in learn.LABELS
        assert learn.method_settings(method, quick=True)["max_new_tokens"] == 4
    qiu = learn.method_settings("jaxcore_es_qiu")
    assert (qiu["population"], qiu["sigma"], qiu["learning_rate"]) == (30, 1e-3, 5e-4)
    assert learn.method_settings("qiu_loop")["alpha"] == 5e-4
