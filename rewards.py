"""Rewards and metrics: pure functions from sandbox measurements (pass rates, CPU seconds, peak
bytes) to numbers.

What it is: each role's whole reward composed in one function: `planner_reward` (pass rate of the
programs the frozen Coder writes from a plan, then a sigmoid-weighted CPU-time bonus, then the
format gate) and `coder_reward` (pass rate, then a space-efficiency bonus relative to O_target, the
lowest peak memory among the group's all-passing programs); then the unbiased pass@k estimator, APR
(average pass rate), Collaboration Gain, the exact McNemar test, and a toy reward for train.py's
sanity-check stage. MapCoder's Retrieval and Debugging agents reuse these: a recollection is scored
like a plan (the programs the frozen Planner -> Coder write from it, no gate), a repair like a
program; train.py's STAGES table says which applies.

What it is not: nothing here runs code, loads a model or imports torch; the inputs are plain numbers
the sandbox measured. GRPO's group normalisation of these rewards lives in grpo.py.

The paper's exact reward formulas are not available to us. Every choice below is a keyword argument
with a default, and its docstring line starts "our choice:". The one property we treat as
non-negotiable, because the method description puts correctness first and efficiency second, is
lexicographic: *more tests passed always beats faster / leaner*, exactly, for any inputs. The
efficiency bonus is therefore only ever earned by programs that pass all their tests, and (for the
Planner, whose reward averages M programs) its scale is capped below the smallest pass-rate gap in
the group.

References: Chen et al. 2021 (arXiv:2107.03374) for pass@k; DeepSeekMath (Shao et al. 2024) for
GRPO's group-relative rewards; the CoRe-Code paper's description of its rewards (pass rate first,
then time for the Planner and memory for the Coder).
"""
import math

import numpy as np


def _sigmoid(x):
    # Written to never overflow exp() for large |x|.
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _shrink(d, floor):
    """Soft threshold: d moved toward 0 by `floor`, and 0 inside [-floor, floor] (differences below
    a noise floor are ties; above it they keep their sign and grow continuously)."""
    return math.copysign(max(0.0, abs(d) - floor), d)


def _measured(x):
    """True for a usable measurement: a finite number >= 0 (None / NaN / negative mean 'not
    measured')."""
    return (x is not None and isinstance(x, (int, float, np.integer, np.floating))
            and math.isfinite(x) and x >= 0)


def _check_rates(rates, what):
    for p in rates:
        if not (isinstance(p, (int, float, np.integer, np.floating)) and 0.0 <= p <= 1.0):
            raise ValueError(f"{what}: pass rates must be numbers in [0, 1], got {p!r}")


def planner_reward(pass_rates, cpu_s, labels=None, w_time=0.1, gate_penalty=0.5, truncation_penalty=0.1):
    """The Planner's reward for one group of G plans: pass_rates[g][m] and cpu_s[g][m] of the M
    programs the frozen Coder wrote from plan g, labels[g] the gate label of plan g
    (agents.gate_label; None: no gate, as for MapCoder's Retrieval agent). Returns G floats:
    `pass_then_time` of the programs, then `format_gated` by the labels. w_time=0 gives the same
    reward without its time term (train.py logs how often that term reorders a group)."""
    rewards = pass_then_time(pass_rates, cpu_s, w_time=w_time)
    if labels is None:
        return rewards
    return format_gated(rewards, labels, penalty=gate_penalty, truncation_penalty=truncation_penalty)


def pass_then_time(pass_rates, cpu_s, w_time=0.1, sharpness=4.0, min_cpu_s=1e-3, tie_margin=0.5,
                    noise_rel=0.25, noise_abs_s=1e-3):
    """Rewards of one group of G Algorithmic Thoughts: pass_rates[g][m], cpu_s[g][m] for the M
    programs the frozen Coder wrote from plan g. Returns G floats in [0, 1 + w_time).

        r_g   = P_g + w_eff * B_g
        P_g   = mean_m pass_rates[g][m]                                (correctness first)
        B_g   = mean_m sigmoid(sharpness * shrink(t_ref - t_gm) / max(t_ref, min_cpu_s))
                over the programs that pass all tests, 0 for the others        (then time)
        t_ref = median CPU time of the group's all-passing programs (all G*M of them)
        shrink(d) = sign(d) * max(0, |d| - floor), floor = max(noise_rel * t_ref, noise_abs_s):
                a time within the noise floor of the median counts as the median (a tie): G copies
                of one program get equal rewards, while a real difference keeps its order.
        w_eff = min(w_time, tie_margin * delta), delta = the smallest gap P_g - P_h > 0 between a
                plan g and a plan h that earns a bonus (B_h > 0); w_eff = w_time if none exists.

    Exactly lexicographic: P_g > P_h gives P_g - P_h >= delta > w_eff >= w_eff * (B_h - B_g) (B in
    [0, 1)), so r_g > r_h. With M = 1 a bonus earner has P_h = 1: nothing beats it, w_eff = w_time.
    Among equal P, faster all-passing programs win; a group where nothing passes gets all zeros.

    w_time: our choice 0.1, the largest time bonus (a tenth of full correctness): efficiency comes
        second, and GRPO's per-group normalisation passes on only the order and relative spacing.
    sharpness: our choice 4.0, the sigmoid slope k: half the median time -> 0.88, the median -> 0.5,
        twice -> 0.02 (the paper's "sigmoid weighting"; ~2x is where CPU-time differences of small
        programs stop being noise).
    min_cpu_s: our choice 1 ms, the reference time's floor (noise below it; no division by 0).
    tie_margin: our choice 0.5 (in (0, 1)): the time bonus uses at most half the smallest pass-rate
        gap, which keeps "more tests passed beats faster" strict for any inputs.
    noise_rel, noise_abs_s: our choice 25% of the median and 1 ms, measurement noise below them: 8
        single runs of one MBPP program took 1.40-1.74 ms of CPU (the widest pair 24% apart); on a
        loaded CI machine 8 copies, each the min of 3 executions (train.py's TIMING_REPEATS,
        Job.repeat), took 1.54-2.08 ms (0.54 ms apart): a forked run's jitter is mostly absolute,
        hence 1 ms. Without a floor, group normalisation turns it into advantages of +-1.
    Our choice: an all-passing program whose CPU time is missing (None / NaN / < 0) earns no time
        bonus, because a failed measurement must never be rewarded.
    """
    if not 0.0 < tie_margin < 1.0:
        raise ValueError(f"tie_margin must be in (0, 1), got {tie_margin}")
    if w_time < 0 or sharpness < 0 or min_cpu_s <= 0 or noise_rel < 0 or noise_abs_s < 0:
        raise ValueError("w_time, sharpness, noise_rel and noise_abs_s must be >= 0 and min_cpu_s > 0")
    if len(pass_rates) != len(cpu_s):
        raise ValueError(f"pass_rates has {len(pass_rates)} plans but cpu_s has {len(cpu_s)}")
    for g, (ps, ts) in enumerate(zip(pass_rates, cpu_s)):
        if len(ps) != len(ts) or len(ps) == 0:
            raise ValueError(f"plan {g}: {len(ps)} pass rates vs {len(ts)} CPU times (need equal, >= 1)")
        _check_rates(ps, f"plan {g}")
    P = [float(np.mean(ps)) for ps in pass_rates]  # (G,)
    # The all-passing programs are the only ones whose speed counts.
    times = [t for ps, ts in zip(pass_rates, cpu_s) for p, t in zip(ps, ts) if p >= 1.0 and _measured(t)]
    if not times:
        return P
    t_ref = float(np.median(times))
    scale = max(t_ref, min_cpu_s)
    floor = max(noise_rel * t_ref, noise_abs_s)
    B = [float(np.mean([_sigmoid(sharpness * _shrink(t_ref - t, floor) / scale)
                        if p >= 1.0 and _measured(t) else 0.0 for p, t in zip(ps, ts)]))
         for ps, ts in zip(pass_rates, cpu_s)]  # (G,) each in [0, 1)
    gaps = [Pg - Ph for Pg in P for Ph, Bh in zip(P, B) if Bh > 0 and Pg > Ph]
    w_eff = min(w_time, tie_margin * min(gaps)) if gaps else w_time
    return [p + w_eff * b for p, b in zip(P, B)]


def coder_reward(pass_rates, peak_bytes, w_mem=0.1, smooth_bytes=1 << 20, noise_rel=0.1, noise_bytes=1 << 20):
    """The Coder's reward for one group of G programs written from the same plan (or, for the
    Debugging agent, the G repairs of one program). Returns G floats in [0, 1 + w_mem]. w_mem=0
    gives the same reward without its memory term.

        r_i      = p_i + w_mem * b_i
        b_i      = (O_target + smooth_bytes) / (O_target + excess_i + smooth_bytes)
                   if program i passes all tests, 0 otherwise
        O_target = the lowest peak memory among the group's all-passing programs
        excess_i = max(0, peak_i - O_target - floor),
                   floor = max(noise_rel * O_target, noise_bytes): peaks within the noise floor of
                   O_target count as O_target (a tie, bonus 1)

    The bonus is 1 (its maximum) for the O_target program and falls strictly as peak memory grows;
    it is only earned with a pass rate of 1, so any all-passing program (r >= 1) beats any program
    that fails a test (r = p < 1): more tests passed always beats less memory, exactly, for any
    w_mem.

    w_mem: our choice 0.1, the largest memory bonus, for the same reason as pass_then_time's w_time.
    smooth_bytes: our choice 1 MiB added to both peaks: a ratio O_target/peak needs a guard anyway
        (the sandbox reports peak memory *above a no-op child*, often 0 for tiny programs), and
        differences of a few hundred kilobytes should move the bonus only a little.
    noise_rel, noise_bytes: our choice 10% of O_target and 1 MiB: below that a difference is
        allocator and page-granularity noise. Measured: copies of one small program, each the median
        of 3 runs, differ by a per-worker offset (the fork server's heap layout decides whether the
        run's allocations land on resident pages), 72-170 KiB apart here and up to 287 KiB on CI;
        repeats on the same worker do not remove it. 1 MiB is ~3.5x the widest spread seen. Without
        a floor, GRPO's group normalisation turns that jitter into advantages of about +-1.
    An all-passing program whose peak is missing (None / NaN / < 0) earns no bonus (reward exactly
        1): our choice, because a failed measurement must never be rewarded.
    """
    if len(pass_rates) != len(peak_bytes):
        raise ValueError(f"{len(pass_rates)} pass rates but {len(peak_bytes)} peak measurements")
    if w_mem < 0 or smooth_bytes <= 0 or noise_rel < 0 or noise_bytes < 0:
        raise ValueError("w_mem, noise_rel and noise_bytes must be >= 0 and smooth_bytes > 0")
    _check_rates(pass_rates, "coder group")
    passing = [i for i, (p, m) in enumerate(zip(pass_rates, peak_bytes)) if p >= 1.0 and _measured(m)]
    rewards = [float(p) for p in pass_rates]
    if not passing:
        return rewards
    target = min(float(peak_bytes[i]) for i in passing)
    floor = max(noise_rel * target, noise_bytes)
    for i in passing:
        excess = max(0.0, float(peak_bytes[i]) - target - floor)
        rewards[i] += w_mem * (target + smooth_bytes) / (target + excess + smooth_bytes)
    return rewards


def format_gated(rewards, labels, penalty=0.5, truncation_penalty=0.1):
    """The Planner's format gate. labels[g] is agents.gate_label of plan g: "ok" keeps its reward,
    "truncated" (it reached its token limit, well formed as far as it went) keeps its reward minus
    truncation_penalty, anything else (malformed, copied placeholders, content-free, a restatement)
    gets -penalty whatever its programs scored.

    our choice: the reward only scores the programs the frozen Coder writes, and the Coder also sees
    the problem, so the cheapest way up is a plan that says nothing (copied placeholders, labels
    without content, generic steps) and lets the Coder code alone. A pilot at lr 1e-4 drifted there
    in 8 steps (plans with all four parts 26/30 -> 1/30). The gate makes format come first: a
    well-formed plan that fails (0) beats a broken one that passes (-penalty), so even an
    all-failing group teaches the format.
    penalty 0.5: below every well-formed reward (>= 0), so the order is strict, and small enough
        that the advantages of format errors do not swamp the pass-rate signal in mixed groups.
    truncation_penalty 0.1: a truncated plan is judged by what its programs did (the Coder saw what
        was written), not failed as malformed (that acted as a length penalty on informative plans);
        the small deduction makes finishing within the limit preferable to rambling into it, and
        keeps a truncated plan above a gated one.
    """
    if len(rewards) != len(labels):
        raise ValueError(f"{len(rewards)} rewards but {len(labels)} gate labels")
    if penalty < 0 or truncation_penalty < 0:
        raise ValueError(f"penalty and truncation_penalty must be >= 0, got {penalty}, {truncation_penalty}")
    gated = []
    for r, label in zip(rewards, labels):
        if label == "ok":
            gated.append(float(r))
        elif label == "truncated":
            gated.append(float(r) - truncation_penalty)
        else:
            gated.append(-float(penalty))
    return gated


def rank_changed(rewards, without, group_size):
    """The share of groups (consecutive runs of group_size) whose ranking a reward term changed: the
    order of `rewards` differs from the order of `without`, the same rewards without that term (ties
    are an order too, so a term that only breaks a tie changed the ranking). GRPO's advantages see
    nothing else of a term: one that never changes a ranking adds a constant within each group and
    teaches nothing."""
    def order(group):
        return [sorted(set(group)).index(x) for x in group]  # dense ranks

    n = len(rewards) // group_size
    changed = [order(rewards[i * group_size:(i + 1) * group_size])
               != order(without[i * group_size:(i + 1) * group_size]) for i in range(n)]
    return sum(changed) / n if n else 0.0


def mcnemar_exact(b, c):
    """Two-sided exact McNemar test (a binomial test on the discordant pairs) for paired pass/fail
    outcomes.

    b = problems solved only by the first system, c = solved only by the second, on the same
    problems. Under H0 each discordant problem goes either way with probability 1/2: p = min(1, 2 *
    P(X <= min(b, c))), X ~ Binomial(b + c, 1/2). Returns 1.0 when there are no discordant pairs.
    """
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    n, k = int(b) + int(c), min(int(b), int(c))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2.0 * tail)


def pass_at_k(n, c, k):
    """Unbiased pass@k estimate from n samples of which c are correct (Chen et al. 2021): 1 -
    C(n-c, k) / C(n, k), computed as 1 - prod_{j=n-c+1..n} (1 - k/j), which never forms the huge
    binomials. Exact at the edges: c = 0 -> 0.0; n - c < k -> 1.0 (every k-subset holds a correct
    one).
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(per_problem, k):
    """Mean pass@k over problems. per_problem[i] is the list of the n_i samples of problem i, each a
    bool or a pass rate (a sample is correct when it passes all tests, i.e. its value is >= 1)."""
    if len(per_problem) == 0:
        raise ValueError("mean_pass_at_k of no problems")
    return float(np.mean([pass_at_k(len(s), sum(1 for x in s if x >= 1), k) for s in per_problem]))


def apr(pass_rates):
    """Average pass rate: the mean fraction of tests passed. pass_rates is a flat list (one per
    problem) or a nested list (samples per problem); nested lists are averaged per problem first so
    each problem weighs the same however many samples it has."""
    if len(pass_rates) == 0:
        raise ValueError("apr of no pass rates")
    per_problem = [float(np.mean(x)) if isinstance(x, (list, tuple, np.ndarray)) else float(x)
                   for x in pass_rates]
    _check_rates(per_problem, "apr")
    return float(np.mean(per_problem))


def collaboration_gain(pass1_with, pass1_without):
    """Collaboration Gain: pass@1 of the Coder given the helper agent's output (e.g. the Planner's
    plan) minus pass@1 of the Coder alone, on the same problems. Positive = the helper helps."""
    return float(pass1_with) - float(pass1_without)


def toy_rewards(texts, target="a"):
    """Sanity-check reward for train.py's `--stage toy` (no sandbox): the fraction of each text's
    characters equal to `target` (0.0 for an empty text). Not part of the method: it only shows that
    GRPO moves a policy toward a trivially checkable preference in a few steps."""
    if len(target) != 1:
        raise ValueError(f"target must be one character, got {target!r}")
    return [t.count(target) / len(t) if t else 0.0 for t in texts]
