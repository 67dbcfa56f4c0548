"""The statistical claims in references/verifying/ and references/delivering/, checked on synthetic data.

Standard library only (random, statistics, math), fixed seeds, no timing: each test either recomputes a
number the references print or simulates the design they describe and checks the claimed behaviour.
The two torch checks are skipped when torch is not installed.
"""
import math
import random
import statistics as st
import subprocess
import sys

import pytest

from conftest import REPO, missing, need_module

# The t quantiles printed in methodology.md (V2, V3, V4): two-sided 95% for df 1..9 and 19, and t(0.80, df=8).
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 19: 2.09}


def t_pdf(x, df):
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    return c * (1 + x * x / df) ** (-(df + 1) / 2)


def t_cdf(x, df, steps=4000):
    """P(T <= x) for x >= 0 by Simpson's rule on [0, x] (the density is symmetric)."""
    h = x / steps
    s = t_pdf(0, df) + t_pdf(x, df) + sum((4 if i % 2 else 2) * t_pdf(i * h, df) for i in range(1, steps))
    return 0.5 + s * h / 3


@pytest.mark.parametrize("df", sorted(T975))
def test_printed_t_quantiles_cover_95_percent(df):
    coverage = 2 * t_cdf(T975[df], df) - 1
    assert abs(coverage - 0.95) < 0.002, (df, coverage)


def test_printed_t80_for_df8():
    assert abs(t_cdf(0.89, 8) - 0.80) < 0.002


def two_sample_t(a, b):
    """Student's pooled two-sample t statistic (equal n, equal variances in the simulations below)."""
    n = len(a)
    sp2 = (st.variance(a) + st.variance(b)) / 2
    return (st.fmean(a) - st.fmean(b)) / math.sqrt(sp2 * 2 / n)


def paired_t(a, b):
    d = [x - y for x, y in zip(a, b)]
    return st.fmean(d) / (st.stdev(d) / math.sqrt(len(d)))


def test_paired_test_finds_an_effect_the_unpaired_test_misses():
    """V3: arms share a large per-seed effect; the paired test sees the method's +0.5, the unpaired one rarely."""
    rng = random.Random(3)
    n, sims, effect = 5, 2000, 0.5
    hits_paired = hits_unpaired = 0
    for _ in range(sims):
        seed_effect = [rng.gauss(0, 1.0) for _ in range(n)]        # init / data order, shared by both arms
        base = [75 + u + rng.gauss(0, 0.1) for u in seed_effect]
        method = [75 + effect + u + rng.gauss(0, 0.1) for u in seed_effect]
        hits_paired += abs(paired_t(method, base)) > 2.776            # t(0.975, df=4)
        hits_unpaired += abs(two_sample_t(method, base)) > 2.306      # t(0.975, df=8)
    assert hits_paired / sims > 0.95
    assert hits_unpaired / sims < 0.25


def power(effect_sd, n, paired, sims=4000, seed=0):
    """Share of simulated experiments whose two-sided 5% t test rejects, for a true effect in sd units."""
    rng = random.Random(seed)
    crit = {True: {5: 2.776}, False: {5: 2.306}}[paired][n]
    hits = 0
    for _ in range(sims):
        if paired:
            d = [rng.gauss(effect_sd, 1.0) for _ in range(n)]         # differences, sd_d = 1
            t = st.fmean(d) / (st.stdev(d) / math.sqrt(n))
        else:
            a = [rng.gauss(effect_sd, 1.0) for _ in range(n)]
            b = [rng.gauss(0.0, 1.0) for _ in range(n)]
            t = two_sample_t(a, b)
        hits += abs(t) > crit
    return hits / sims


def test_mde_table_unpaired_n5():
    """V4: with 5 seeds per arm, 2.02 sd is detected ~80% of the time; the 1.46 sd 'threshold' only ~50%."""
    assert abs(power(2.02, 5, paired=False) - 0.80) < 0.03
    assert abs(power(1.46, 5, paired=False, seed=1) - 0.50) < 0.03


def test_mde_table_paired_n5():
    assert abs(power(1.68, 5, paired=True) - 0.80) < 0.03
    assert 0.45 < power(1.24, 5, paired=True, seed=1) < 0.60      # "about half" (0.55 exactly at df = 4)


def test_mcnemar_example_and_accuracy_standard_error():
    """V5: the printed McNemar example and the standard error of accuracy on 1,000 and 10,000 items."""
    def mcnemar_p(b, c):
        k, n = min(b, c), b + c
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
    assert 0.055 < mcnemar_p(31, 17) < 0.065
    assert round(100 * math.sqrt(0.9 * 0.1 / 1000), 2) == 0.95
    assert round(100 * math.sqrt(0.9 * 0.1 / 10000), 2) == 0.30


def test_best_of_k_bias_and_family_wise_error():
    """V6: the expected best of 5 and of 20 normal draws, and 1 - 0.95**20."""
    rng = random.Random(6)
    for k, expected in ((5, 1.163), (20, 1.867)):
        mean_max = st.fmean(max(rng.gauss(0, 1) for _ in range(k)) for _ in range(20000))
        assert abs(mean_max - expected) < 0.02, (k, mean_max)
    assert round(1 - 0.95 ** 20, 2) == 0.64


def test_seed_interval_example_prints_what_the_text_says():
    """V2 and V3: the worked numbers in the snippets."""
    xs = [76.1, 76.6, 75.9, 76.4, 76.5]
    assert f"{st.fmean(xs):.1f} ± {st.stdev(xs):.1f}" == "76.3 ± 0.3"
    base = [75.2, 76.9, 74.8, 76.1, 75.5]
    method = [75.7, 77.3, 75.4, 76.5, 76.1]
    d = [m - b for m, b in zip(method, base)]
    half = 2.78 * st.stdev(d) / math.sqrt(len(d))
    assert (round(st.fmean(d) - half, 2), round(st.fmean(d) + half, 2)) == (0.38, 0.62)
    assert 0.7 < st.stdev(base) < 0.9 and 0.7 < st.stdev(method) < 0.9     # the overlapping bands


def test_reconcile_compares_the_last_number_before_the_binding(tmp_path):
    """DL9: "76.1% top-1 <!-- ... -->" compares the 1 of top-1; a binding right after the number passes."""
    (tmp_path / "m.json").write_text('{"eval": {"top1": 0.7612}}')
    bad = tmp_path / "bad.md"
    bad.write_text("ResNet reaches 76.1% top-1 <!-- metric: m.json#eval.top1*100 -->\n")
    good = tmp_path / "good.md"
    good.write_text("top-1 accuracy is 76.1% <!-- metric: m.json#eval.top1*100 -->\n")
    script = str(REPO / "scripts" / "reconcile.py")
    res_bad = subprocess.run([sys.executable, script, str(bad)], capture_output=True, text=True)
    res_good = subprocess.run([sys.executable, script, str(good)], capture_output=True, text=True)
    assert res_bad.returncode == 1 and "claims 1," in res_bad.stdout
    assert res_good.returncode == 0 and "claims 76.1," in res_good.stdout


def test_collapse_report_table():
    """representation-collapse.md: the reading table, on the same synthetic tensors."""
    torch = need_module("torch")
    F = torch.nn.functional

    def collapse_report(z):
        z = z.float().flatten(1)
        off = ~torch.eye(len(z), dtype=torch.bool)
        s = torch.linalg.svdvals(z)
        p = s / s.sum()
        x = F.normalize(z, dim=1)
        return {"std": z.std(0).mean().item(), "nstd": (x.std(0).mean() * z.shape[1] ** 0.5).item(),
                "cos": (x @ x.T)[off].mean().item(),
                "erank": torch.exp(-(p * p.clamp_min(1e-12).log()).sum()).item()}

    g = torch.Generator().manual_seed(0)
    n, d = 512, 128
    healthy = collapse_report(torch.randn(n, d, generator=g))
    complete = collapse_report(torch.randn(1, d, generator=g).repeat(n, 1) + 1e-6 * torch.randn(n, d, generator=g))
    low = collapse_report(torch.randn(n, 4, generator=g) @ torch.randn(4, d, generator=g))
    offset = collapse_report(10 * torch.ones(n, d) + 0.1 * torch.randn(n, d, generator=g))
    assert healthy["erank"] > 115 and abs(healthy["nstd"] - 1) < 0.05 and abs(healthy["cos"]) < 0.02
    assert complete["std"] < 1e-4 and complete["cos"] > 0.999 and complete["erank"] < 1.1
    assert 3 < low["erank"] < 5 and low["nstd"] > 0.8
    assert offset["cos"] > 0.99 and offset["nstd"] < 0.05 and offset["erank"] < 3


class _OwnsGenerator:
    """A Dataset that creates its numpy generator in __init__ (V15)."""
    def __init__(self):
        import numpy as np
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import numpy as np
        return np.float64(np.random.rand()), np.float64(self.rng.random())


def test_dataset_owned_generator_replays_across_workers_and_epochs():
    """V15: PyTorch reseeds NumPy's global state per worker, but a generator copied from __init__ repeats."""
    torch = need_module("torch")
    need_module("numpy")
    import multiprocessing
    if "fork" not in multiprocessing.get_all_start_methods():
        missing("needs the fork start method (run the suite on Linux)")
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(_OwnsGenerator(), batch_size=1, num_workers=2,
                                         multiprocessing_context="fork")
    epochs = [[(float(a), float(b)) for a, b in loader] for _ in range(2)]
    globals_, owned = [[x[0] for x in e] for e in epochs], [[x[1] for x in e] for e in epochs]
    assert len(set(globals_[0] + globals_[1])) == 8                  # global state: fresh per worker and epoch
    assert owned[0] == owned[1]                                      # the owned generator replays every epoch
    assert owned[0][0] == owned[0][1]                                # and both workers draw the same value
