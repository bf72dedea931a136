"""Tests for rewards.py: the reward properties we promise (checked on random groups), equality with
straightforward reference formulas, pass@k against the binomial definition, and the metric helpers."""
import math
import random
from itertools import product

import pytest

import rewards

N_RANDOM = 300  # random groups per property: enough to hit edge cases, well under a second


def random_planner_group(rng, all_pass_bias=0.5):
    """G thoughts x M programs with pass rates k/n (n tests) and CPU times spanning three decades."""
    G, M, n = rng.randint(2, 8), rng.randint(1, 4), rng.randint(1, 10)
    rates = [[1.0 if rng.random() < all_pass_bias else rng.randint(0, n) / n for _ in range(M)]
             for _ in range(G)]
    times = [[10 ** rng.uniform(-4, -1) for _ in range(M)] for _ in range(G)]
    return rates, times


def mean(xs):
    return sum(xs) / len(xs)


# ------------------------------------------------------------------------------------------ Planner

def test_planner_more_tests_passed_always_beats_faster():
    rng = random.Random(0)
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        r = rewards.pass_then_time(rates, times)
        P = [mean(ps) for ps in rates]
        for g in range(len(P)):
            for h in range(len(P)):
                if P[g] > P[h]:
                    assert r[g] > r[h], (rates, times, r)


def test_planner_more_tests_beats_faster_even_with_a_huge_time_weight():
    # The cap w_eff = tie_margin * smallest gap keeps the order whatever w_time is.
    rng = random.Random(1)
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        r = rewards.pass_then_time(rates, times, w_time=50.0, sharpness=20.0)
        P = [mean(ps) for ps in rates]
        assert all(r[g] > r[h] for g in range(len(P)) for h in range(len(P)) if P[g] > P[h])


def test_planner_among_all_pass_faster_scores_higher():
    rng = random.Random(2)
    for _ in range(N_RANDOM):
        G = rng.randint(2, 8)
        times = rng.sample([k * 1e-3 for k in range(1, 200)], G)  # distinct, 1 ms .. 0.2 s
        # Without a noise floor every time difference counts; with the default floor faster never scores lower.
        r = rewards.pass_then_time([[1.0]] * G, [[t] for t in times], noise_rel=0.0,
                                   noise_abs_s=0.0)
        order_by_time = sorted(range(G), key=lambda g: times[g])
        order_by_reward = sorted(range(G), key=lambda g: -r[g])
        assert order_by_time == order_by_reward
        r = rewards.pass_then_time([[1.0]] * G, [[t] for t in times])
        assert all(r[g] >= r[h] for g in range(G) for h in range(G) if times[g] < times[h])


def test_planner_equal_pass_rates_tie_broken_by_the_speed_of_all_passing_programs():
    # M = 2, both thoughts pass 50% on average; only the all-passing program's time matters.
    r = rewards.pass_then_time([[1.0, 0.0], [1.0, 0.0]], [[0.01, 5.0], [0.02, 0.0001]])
    assert r[0] > r[1] > 0.5


def test_planner_bounded():
    rng = random.Random(3)
    w = 0.1
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        for x in rewards.pass_then_time(rates, times, w_time=w):
            assert 0.0 <= x < 1.0 + w


def test_planner_nobody_passes_gives_all_zero():
    assert rewards.pass_then_time([[0.0, 0.0]] * 4, [[0.1, 0.2]] * 4) == [0.0] * 4


def test_planner_without_all_pass_programs_reward_is_the_mean_pass_rate():
    rates = [[0.5, 0.25], [0.75, 0.0], [0.0, 0.0]]
    assert rewards.pass_then_time(rates, [[1.0, 2.0]] * 3) == [0.375, 0.375, 0.0]


def test_planner_times_of_failing_programs_are_ignored():
    rates = [[1.0, 0.5], [1.0, 1.0], [0.5, 0.0]]
    a = rewards.pass_then_time(rates, [[0.01, 0.02], [0.03, 0.01], [0.5, 0.7]])
    b = rewards.pass_then_time(rates, [[0.01, 9.00], [0.03, 0.01], [0.0, 3.0]])
    assert a == b


def test_planner_matches_the_reference_formula():
    # Independent straightforward computation: M = 1, all pass, so w_eff = w_time.
    times = [0.004, 0.010, 0.020]   # median 0.010
    r = rewards.pass_then_time([[1.0]] * 3, [[t] for t in times], w_time=0.1, sharpness=4.0,
                               noise_rel=0.0, noise_abs_s=0.0)
    expected = [1.0 + 0.1 / (1.0 + math.exp(-4.0 * (0.010 - t) / 0.010)) for t in times]
    assert r == pytest.approx(expected, abs=1e-12)
    # With the noise floor (25% of the median here): the differences shrink by 2.5 ms toward the median.
    r = rewards.pass_then_time([[1.0]] * 3, [[t] for t in times], w_time=0.1, sharpness=4.0,
                               noise_rel=0.25)
    expected = [1.0 + 0.1 / (1.0 + math.exp(-4.0 * d / 0.010)) for d in (0.0035, 0.0, -0.0075)]
    assert r == pytest.approx(expected, abs=1e-12)
    assert r[1] == pytest.approx(1.05)  # the median program gets half the bonus


def test_planner_time_floor_keeps_microsecond_programs_apart_only_a_little():
    # Below min_cpu_s the reference time is floored: 10 us vs 20 us must not look like 2x.
    r = rewards.pass_then_time([[1.0], [1.0]], [[1e-5], [2e-5]], noise_abs_s=0.0)
    assert r[0] > r[1] and r[0] - r[1] < 1e-3


def test_planner_missing_time_earns_no_bonus():
    r = rewards.pass_then_time([[1.0], [1.0]], [[None], [0.01]])
    assert r[0] == 1.0 and r[1] > 1.0
    r = rewards.pass_then_time([[1.0], [1.0]], [[float("nan")], [-1.0]])
    assert r == [1.0, 1.0]


def test_planner_rejects_bad_input():
    with pytest.raises(ValueError, match="plans"):
        rewards.pass_then_time([[1.0]], [[0.1], [0.2]])
    with pytest.raises(ValueError, match="CPU times"):
        rewards.pass_then_time([[1.0, 1.0]], [[0.1]])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rewards.pass_then_time([[1.5]], [[0.1]])
    with pytest.raises(ValueError, match="tie_margin"):
        rewards.pass_then_time([[1.0]], [[0.1]], tie_margin=1.0)


# ------------------------------------------------------------------------ Planner: the whole reward

# A hand-made group of 4 plans x 2 programs: partly and fully passing plans, distinct CPU times.
GROUP_RATES = [[1.0, 0.5], [1.0, 1.0], [0.0, 0.5], [1.0, 1.0]]
GROUP_TIMES = [[0.002, 0.004], [0.010, 0.003], [0.001, 0.001], [0.030, 0.020]]


def test_planner_reward_is_pass_then_time_then_the_format_gate():
    labels = ["ok", "truncated", "content-free", "ok"]
    expected = rewards.format_gated(rewards.pass_then_time(GROUP_RATES, GROUP_TIMES), labels)
    assert rewards.planner_reward(GROUP_RATES, GROUP_TIMES, labels) == expected


def test_planner_reward_of_a_gated_plan_is_minus_the_penalty_whatever_its_pass_rate():
    rng = random.Random(7)
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        labels = ["content-free"] + ["ok"] * (len(rates) - 1)
        assert rewards.planner_reward(rates, times, labels)[0] == -0.5


def test_planner_reward_of_a_truncated_plan_is_its_programs_reward_less_the_truncation_penalty():
    rng = random.Random(8)
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        labels = ["truncated"] + ["ok"] * (len(rates) - 1)
        programs = rewards.pass_then_time(rates, times)[0]
        assert rewards.planner_reward(rates, times, labels)[0] == pytest.approx(programs - 0.1)


def test_planner_reward_without_labels_is_pass_then_time():
    rng = random.Random(9)
    for _ in range(N_RANDOM):
        rates, times = random_planner_group(rng)
        assert rewards.planner_reward(rates, times) == rewards.pass_then_time(rates, times)


def test_planner_reward_without_its_time_term_is_the_gated_mean_pass_rate():
    labels = ["ok", "truncated", "content-free", "ok"]
    expected = rewards.format_gated([mean(ps) for ps in GROUP_RATES], labels)
    assert rewards.planner_reward(GROUP_RATES, GROUP_TIMES, labels, w_time=0.0) == expected


# ------------------------------------------------------------------------------------------ Coder

def random_coder_group(rng):
    G, n = rng.randint(2, 10), rng.randint(1, 10)
    rates = [1.0 if rng.random() < 0.5 else rng.randint(0, n) / n for _ in range(G)]
    peaks = [rng.choice([0, rng.randint(0, 1 << 30)]) for _ in range(G)]
    return rates, peaks


def test_coder_more_tests_passed_always_beats_less_memory():
    rng = random.Random(4)
    for _ in range(N_RANDOM):
        rates, peaks = random_coder_group(rng)
        r = rewards.coder_reward(rates, peaks, w_mem=rng.choice([0.1, 1.0, 10.0]))
        assert all(r[i] > r[j] for i in range(len(r)) for j in range(len(r)) if rates[i] > rates[j])


def test_coder_among_all_pass_less_memory_scores_higher():
    rng = random.Random(5)
    for _ in range(N_RANDOM):
        G = rng.randint(2, 10)
        peaks = rng.sample(range(0, 1 << 30, 4096), G)  # distinct peaks, page-sized steps
        r = rewards.coder_reward([1.0] * G, peaks, noise_rel=0.0, noise_bytes=0)
        assert sorted(range(G), key=lambda i: peaks[i]) == sorted(range(G), key=lambda i: -r[i])
        # With the noise floor: less memory never scores lower.
        r = rewards.coder_reward([1.0] * G, peaks)
        assert all(r[i] >= r[j] for i in range(G) for j in range(G) if peaks[i] < peaks[j])


def test_coder_o_target_program_gets_the_maximum_bonus():
    rates = [1.0, 1.0, 0.5, 1.0]
    peaks = [3 << 20, 1 << 20, 0, 8 << 20]  # the failing program's 0 bytes must not set O_target
    r = rewards.coder_reward(rates, peaks, w_mem=0.1, noise_rel=0.0, noise_bytes=0)
    assert r[1] == pytest.approx(1.1) and max(r) == r[1]
    assert r[2] == 0.5
    # Reference formula: (O_target + c) / (peak + c), c = 1 MiB.
    c = 1 << 20
    assert r[0] == pytest.approx(1.0 + 0.1 * (2 * c) / (3 * c + c))
    assert r[3] == pytest.approx(1.0 + 0.1 * (2 * c) / (8 * c + c))


def test_coder_bounded():
    rng = random.Random(6)
    for _ in range(N_RANDOM):
        rates, peaks = random_coder_group(rng)
        assert all(0.0 <= x <= 1.1 + 1e-12 for x in rewards.coder_reward(rates, peaks, w_mem=0.1))


def test_coder_zero_peak_and_missing_measurements():
    # Peak 0 (leaner than the no-op baseline) is a valid O_target; a missing peak earns no bonus.
    r = rewards.coder_reward([1.0, 1.0, 1.0, 1.0], [0, 4096, None, float("nan")], noise_bytes=0)
    assert r[0] == pytest.approx(1.1) and 1.0 < r[1] < r[0] and r[2] == 1.0 and r[3] == 1.0


def test_coder_nobody_passes_gives_the_pass_rates():
    assert rewards.coder_reward([0.0, 0.0, 0.0], [1, 2, 3]) == [0.0, 0.0, 0.0]
    assert rewards.coder_reward([0.5, 0.25], [1, 2]) == [0.5, 0.25]


def test_coder_rejects_bad_input():
    with pytest.raises(ValueError, match="peak"):
        rewards.coder_reward([1.0, 1.0], [1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rewards.coder_reward([-0.1], [1])


def coder_reward_by_formula(rates, peaks, w_mem=0.1, smooth=1 << 20, noise_rel=0.1,
                            noise_bytes=1 << 20):
    """The Coder's reward as its definition reads: the pass rate, plus for a program that passes
    every test (with a measured peak) w_mem * (O + c) / (O + excess + c), O the group's lowest
    such peak."""
    measured = [m for p, m in zip(rates, peaks) if p == 1.0 and m is not None and m == m and m >= 0]
    if not measured:
        return [float(p) for p in rates]
    target = min(measured)
    floor = max(noise_rel * target, noise_bytes)
    out = []
    for p, m in zip(rates, peaks):
        bonus = 0.0
        if p == 1.0 and m is not None and m == m and m >= 0:
            bonus = (target + smooth) / (target + max(0.0, m - target - floor) + smooth)
        out.append(p + w_mem * bonus)
    return out


def test_coder_reward_is_the_pass_rate_plus_the_memory_bonus_of_all_passing_programs():
    rng = random.Random(10)
    for _ in range(N_RANDOM):
        rates, peaks = random_coder_group(rng)
        expected = coder_reward_by_formula(rates, peaks)
        assert rewards.coder_reward(rates, peaks) == pytest.approx(expected, abs=1e-12)


def test_coder_reward_without_its_memory_term_is_the_pass_rate():
    rng = random.Random(11)
    for _ in range(N_RANDOM):
        rates, peaks = random_coder_group(rng)
        assert rewards.coder_reward(rates, peaks, w_mem=0.0) == [float(p) for p in rates]


# ------------------------------------------------------------------------------------------ pass@k

def pass_at_k_by_definition(n, c, k):
    """Chen et al. 2021 as written: the chance that a random k-subset of the n samples holds a correct one."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_equals_the_binomial_definition():
    for n in range(1, 13):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                expected = pass_at_k_by_definition(n, c, k)
                assert rewards.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # comb(1000, 100) overflows a float, the product form never forms it; Python's exact ints do.
    for n, c, k in [(1000, 3, 100), (200, 150, 5), (5000, 1, 1)]:
        assert rewards.pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_definition(n, c, k), rel=1e-9)


def test_pass_at_k_edges_are_exact():
    assert rewards.pass_at_k(10, 0, 5) == 0.0
    assert rewards.pass_at_k(10, 6, 5) == 1.0   # n - c = 4 < k
    assert rewards.pass_at_k(10, 10, 1) == 1.0
    assert rewards.pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct


@pytest.mark.parametrize("n,c,k", [(5, 1, 6), (5, 1, 0), (5, 6, 1), (5, -1, 1), (0, 0, 1),
                                   (5.0, 1, 1), (5, 1, True)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):
        rewards.pass_at_k(n, c, k)


def test_mean_pass_at_k_over_problems():
    per_problem = [[True, False, False, False], [1.0, 1.0, 0.5, 0.0], [0.9, 0.0, 0.0, 0.0]]
    expected = (pass_at_k_by_definition(4, 1, 2) + pass_at_k_by_definition(4, 2, 2) + 0.0) / 3
    assert rewards.mean_pass_at_k(per_problem, 2) == pytest.approx(expected)
    with pytest.raises(ValueError):
        rewards.mean_pass_at_k([], 1)


# ------------------------------------------------------------------------------------------ metrics

def test_apr_is_the_mean_fraction_of_tests_passed():
    assert rewards.apr([1.0, 0.5, 0.0]) == pytest.approx(0.5)
    # Nested: per problem first, so a problem with more samples does not weigh more.
    assert rewards.apr([[1.0, 0.0], [0.5]]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        rewards.apr([])


def test_collaboration_gain_is_the_difference():
    assert rewards.collaboration_gain(0.45, 0.40) == pytest.approx(0.05)
    assert rewards.collaboration_gain(0.30, 0.40) == pytest.approx(-0.10)


def test_brute_force_lexicographic_order_on_all_small_planner_groups():
    # Exhaustive over pass rates in {0, 1/2, 1} for 3 thoughts x 2 programs, fixed distinct times.
    values = [0.0, 0.5, 1.0]
    times = [[0.001, 0.004], [0.002, 0.008], [0.016, 0.003]]
    for flat in product(values, repeat=6):
        rates = [list(flat[0:2]), list(flat[2:4]), list(flat[4:6])]
        r = rewards.pass_then_time(rates, times)
        P = [mean(ps) for ps in rates]
        assert all(r[g] > r[h] for g in range(3) for h in range(3) if P[g] > P[h])


def test_toy_rewards_is_the_fraction_of_target_characters():
    assert rewards.toy_rewards(["aab", "", "xyz", "a"], target="a") == [2 / 3, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        rewards.toy_rewards(["ab"], target="ab")


# ------------------------------------------------------------------------------------- noise-aware efficiency


def test_planner_copies_of_one_program_with_measured_jitter_get_zero_advantages():
    # 8 single runs of one MBPP program measured 1.40-1.74 ms of CPU: a group of G thoughts that all lead to that
    # program must carry no signal (before the noise floor the advantages were +-1).
    import grpo

    times = [1.40e-3, 1.74e-3, 1.52e-3, 1.61e-3, 1.45e-3, 1.70e-3, 1.55e-3, 1.49e-3]
    r = rewards.pass_then_time([[1.0]] * 8, [[t] for t in times])
    adv, stats = grpo.group_advantages(r, 8)
    assert (adv == 0).all() and stats["zero_var_frac"] == 1.0


def test_coder_copies_of_one_program_with_measured_jitter_get_zero_advantages():
    import grpo

    peaks = [249856, 262144, 253952, 258048, 249856, 262144, 253952, 249856]  # measured range, page steps
    adv, _ = grpo.group_advantages(rewards.coder_reward([1.0] * 8, peaks), 8)
    assert (adv == 0).all()


def test_a_tenfold_cost_difference_keeps_the_promised_order():
    r = rewards.pass_then_time([[1.0], [1.0]], [[1.5e-3], [15e-3]])
    assert r[0] > r[1]
    r = rewards.coder_reward([1.0, 1.0], [300 << 10, 3000 << 10])
    assert r[0] > r[1]


def test_format_gate_puts_format_first():
    r = rewards.format_gated([1.05, 0.0, 0.5, 1.0, 1.05], ["content-free", "ok", "ok", "ok", "placeholder"],
                             penalty=0.5)
    assert r == [-0.5, 0.0, 0.5, 1.0, -0.5]
    with pytest.raises(ValueError):
        rewards.format_gated([1.0], ["ok", "ok"])
    with pytest.raises(ValueError):
        rewards.format_gated([1.0], ["ok"], penalty=-1)


def test_a_truncated_plan_is_scored_by_its_code_minus_a_small_deduction():
    labels = ["truncated", "truncated", "ok", "missing parts"]
    r = rewards.format_gated([1.0, 0.0, 1.0, 0.0], labels, penalty=0.5, truncation_penalty=0.1)
    assert r == [0.9, -0.1, 1.0, -0.5]
    # Order: a passing truncated plan beats a failing complete one; any truncated plan beats a
    # gated one.
    assert r[0] > 0.0 > r[1] > r[3]


def test_content_free_plans_of_the_agents_tests_never_earn_more_than_the_worst_informative_plan():
    # The gate end to end: the Coder passing with a content-free plan (1.05) still ranks below an informative plan
    # whose program fails (0.0).
    import agents
    from test_agents import CONTENT_FREE, INFORMATIVE

    free = rewards.format_gated([1.05] * len(CONTENT_FREE),
                                [agents.gate_label(p) for p in CONTENT_FREE])
    informative = rewards.format_gated([0.0] * len(INFORMATIVE),
                                       [agents.gate_label(p) for p in INFORMATIVE])
    assert max(free) < min(informative)


def test_an_efficiency_only_group_gets_small_advantages_under_the_std_floor():
    # Every program passes; one copy is measurably slower. Plain std-normalisation turns the 0.03 bonus gap into a
    # full -2.5 advantage; the floor keeps it at the size of the reward difference.
    import grpo
    import torch

    r = [1.05] * 7 + [1.02]
    plain, _ = grpo.group_advantages(r, 8)
    floored, _ = grpo.group_advantages(r, 8, std_floor=0.1)
    assert plain[-1] < -2.0 and -0.35 < floored[-1] < -0.25
    # A group where pass rates differ is untouched by the floor (its std is far above it).
    mixed = [1.0, 0.0] * 4
    assert torch.equal(grpo.group_advantages(mixed, 8)[0], grpo.group_advantages(mixed, 8, std_floor=0.1)[0])


@pytest.mark.parametrize("b,c,p", [(0, 0, 1.0), (5, 0, 0.0625), (12, 3, 0.03515625), (4, 4, 1.0), (0, 6, 0.03125)])
def test_mcnemar_exact_equals_the_two_sided_binomial_tail(b, c, p):
    # Reference values: 2 * sum_{i <= min(b, c)} C(b+c, i) / 2^(b+c), capped at 1.
    assert rewards.mcnemar_exact(b, c) == pytest.approx(p)


def test_mcnemar_rejects_bad_input():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            rewards.mcnemar_exact(bad, 1)


def test_apr_averages_per_problem_not_over_flattened_samples():
    # Per problem: mean(1, 1, 1) = 1 and mean(0) = 0 -> 0.5; flattened it would be 3/4.
    assert rewards.apr([[1, 1, 1], [0]]) == 0.5


def test_rank_changed_counts_groups_whose_order_a_term_changed():
    # group 1: the term breaks a tie (changed); group 2: it adds a constant (unchanged); group 3: nothing passes.
    full = [1.05, 1.0, 1.1, 0.1, 0.0, 0.0]
    without = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert rewards.rank_changed(full, without, 2) == pytest.approx(1 / 3)


def test_the_time_term_changes_the_ranking_only_where_times_differ_beyond_the_noise_floor():
    # Two all-passing plans, 1 ms vs 20 ms: the time term reorders; 1.0 vs 1.1 ms (within the floor): it does not.
    apart = rewards.pass_then_time([[1.0], [1.0]], [[0.001], [0.020]])
    close = rewards.pass_then_time([[1.0], [1.0]], [[0.0010], [0.0011]])
    bare = rewards.pass_then_time([[1.0], [1.0]], [[0.001], [0.020]], w_time=0.0)
    assert rewards.rank_changed(apart, bare, 2) == 1.0 and rewards.rank_changed(close, bare, 2) == 0.0


def test_the_memory_term_is_a_constant_under_the_noise_floor():
    # MBPP-sized peaks (0.2 vs 0.3 MB) tie under the 1 MiB floor: +0.1 each, the order unchanged.
    full = rewards.coder_reward([1.0, 1.0], [200_000, 300_000])
    without = rewards.coder_reward([1.0, 1.0], [0, 0], w_mem=0)
    assert full == [1.1, 1.1] and rewards.rank_changed(full, without, 2) == 0
