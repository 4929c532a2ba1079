"""A performance hunt's statistics: are two commits' samples of a metric the same, different, or not yet
known; which end of the range a commit's samples are like; how large the change is, with its confidence
interval. Pure logic over lists of numbers; the tests come from scipy.stats (the `perf` extra), imported
when first needed so the rest of bisector runs without it.

The comparison is Chromium Pinpoint's (dashboard/pinpoint/models/compare): the p-value is the smaller of
the Mann-Whitney U and the Kolmogorov-Smirnov tests'; at or below LOW_THRESHOLD the samples are different;
above a high threshold that falls as samples grow they are the same; in between, more samples are needed.
That decides whether the ends differ. Which end a commit is like is a sequential likelihood-ratio test
(Student t likelihoods around each end's median) checked by the same rank tests (docs/perf.md).
"""
from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

LOW_THRESHOLD = 0.01
# A commit is called like one end only while its samples are plainly consistent with that end's: a p-value
# against it above this (between LOW_THRESHOLD and this, more samples are taken).
CONSISTENT = 0.05
# ... or the 95 % interval of the change of its median from that end's lies within SAME_SHIFT of the distance
# between the ends' medians (an equivalence test): a shift that small is no difference that matters, however
# steady the runs (the H200's GPU-bound decode in round 7: runs 0.2 % apart told apart at p = 0.013, by a third
# of a per cent the ends' own runs drifted over the hunt); runs of two modes give no such narrow interval.
SAME_SHIFT = 0.25
# A commit is called like one end when its samples are LIKELIHOOD_RATIO times likelier under that end's
# distribution than under the other's (a sequential likelihood-ratio test: Student t likelihoods with
# T_DEGREES degrees of freedom, heavy-tailed so that one outlier weighs little) and, as a check that needs
# no model, they differ from the other end's at LOW_THRESHOLD (one-sided: in the direction the ends differ).
LIKELIHOOD_RATIO = 1_000.0
T_DEGREES = 10
# Where the ends' runs overlap (`overlapping`), a commit is like one end only when it differs from the other at
# this one-sided p: LOW_THRESHOLD shared among the up to 20 looks a capped commit gets.
STRICT_THRESHOLD = LOW_THRESHOLD / 20
# One end's runs in two clusters (`two_modes`): at least MODES_SIDE runs in each, split further apart than one
# normal peak's runs are with chance MODES_P (MODES_DRAWS simulated samples of each size).
MODES_SIDE = 3
MODES_P = 0.001
MODES_DRAWS = 20_000
MODES_TRIM = 0.1  # of an end's runs, the lowest and highest tenth are left out of the clusters (outliers)
FAR = 4.0  # scales from an end's median: a run this far out is an outlier, or of a second mode when many are
# Runs of an end nearer the other end's median than their own, more of them than the t model with the pooled
# scale expects at this binomial p: the ends are no single peaks (a second mode inflates the pooled scale).
CROSSING_P = 0.001
LONE = 6.2  # scales: a run this far from its end's median has 1 chance in 10,000 under the t model (T_DEGREES)
# Pinpoint's high thresholds for performance comparisons, one per step of HIGH_THRESHOLD_STEP samples of the
# smaller side (Pinpoint steps every 10; our per-commit caps are smaller): the more samples, the lower the
# p-value that already says "the same".
HIGH_THRESHOLDS = (1.0, 0.3682, 0.1625, 0.0815, 0.0428, 0.0230, 0.0126, 0.0070, 0.0039, 0.0022, 0.0013, 0.0007)
HIGH_THRESHOLD_STEP = 5
CONFIDENCE = 0.95  # of the change's interval
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260  # the interval is reproducible: the same samples give the same interval


class Result(str, Enum):
    DIFFERENT = "different"
    SAME = "same"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


def scipy_missing() -> str | None:
    """Why the statistics cannot run here (scipy not installed), else None."""
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        return "a performance hunt needs scipy: pip install 'bisector[perf]' (or pip install scipy)"
    return None


@dataclass(frozen=True)
class Comparison:
    result: Result
    p_value: float
    high_threshold: float


def high_threshold(a: Sequence[float], b: Sequence[float]) -> float:
    """The p-value above which samples of these sizes are called the same."""
    return HIGH_THRESHOLDS[min(min(len(a), len(b)) // HIGH_THRESHOLD_STEP, len(HIGH_THRESHOLDS) - 1)]


def p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """The smaller of the two-sided Mann-Whitney U and Kolmogorov-Smirnov p-values (1.0 where a side is
    empty or every sample is equal)."""
    return _rank_p(a, b, "two-sided", "two-sided")


def one_sided_p(a: Sequence[float], b: Sequence[float], lower: bool) -> float:
    """The smaller of the one-sided Mann-Whitney U and Kolmogorov-Smirnov p-values that `a` lies below
    `b` (lower) or above it."""
    # scipy names the KS alternative by the empirical distribution functions: a below b is F_a "greater"
    return _rank_p(a, b, "less" if lower else "greater", "greater" if lower else "less")


def _rank_p(a: Sequence[float], b: Sequence[float], mwu_alternative: str, ks_alternative: str) -> float:
    """The smaller of the Mann-Whitney U and Kolmogorov-Smirnov p-values with those alternatives."""
    from scipy import stats

    if not a or not b or len(set(a) | set(b)) == 1:
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mwu = stats.mannwhitneyu(a, b, alternative=mwu_alternative).pvalue
        ks = stats.ks_2samp(a, b, alternative=ks_alternative).pvalue
    found = [float(p) for p in (mwu, ks) if not math.isnan(p)]
    return min(found) if found else 1.0


def compare(a: Sequence[float], b: Sequence[float], lower: bool | None = None) -> Comparison:
    """Pinpoint's verdict on two sets of samples: different, the same, or unknown (more samples). With
    `lower`, one-sided: whether `a` lies below `b` (lower=True) or above it (False)."""
    p = p_value(a, b) if lower is None else one_sided_p(a, b, lower)
    high = high_threshold(a, b)
    if p <= LOW_THRESHOLD:
        return Comparison(Result.DIFFERENT, p, high)
    return Comparison(Result.SAME if p > high else Result.UNKNOWN, p, high)


@dataclass(frozen=True)
class Change:
    """From `before` to `after`: medians, the change of the median relative to the magnitude of before's (a
    negative metric, a log-probability, falls as a positive one does), its confidence interval (bootstrap over
    both sides, percentile method) and the comparison's p-value. From a median of 0 no change is relative:
    `relative` is None and the interval is of the absolute change."""

    before: float
    after: float
    relative: float | None   # (after - before) / |before| (-0.09: 9 % lower); None: before is 0
    low: float               # the CONFIDENCE interval of relative (where it is None: of after - before)
    high: float
    p_value: float

    @property
    def absolute(self) -> float:
        return self.after - self.before

    def largest_shift(self) -> float:
        """The largest change of the median, in the metric's units, that the interval allows."""
        return max(abs(self.low), abs(self.high)) * (1.0 if self.relative is None else abs(self.before))

    def rounded(self) -> Change:
        """This change as results keep it: relative and its interval to six places."""
        return Change(self.before, self.after, None if self.relative is None else round(self.relative, 6),
                      round(self.low, 6), round(self.high, 6), self.p_value)

    def to_json(self) -> dict:
        return {"before": self.before, "after": self.after, "relative": self.relative, "absolute": self.absolute,
                "ci": [self.low, self.high], "confidence": CONFIDENCE, "p_value": self.p_value}

    @classmethod
    def from_json(cls, data: Mapping) -> Change:
        """Also reads records from before the absolute change was kept (it is after - before)."""
        low, high = data["ci"]
        return cls(data["before"], data["after"], data["relative"], low, high, data["p_value"])


def change(before: Sequence[float], after: Sequence[float]) -> Change:
    """How `after`'s median differs from `before`'s (relative to |before|'s median; from 0, absolute), with a
    bootstrap confidence interval."""
    import numpy as np
    from scipy import stats

    med_before, med_after = statistics.median(before), statistics.median(after)
    relative = (med_after - med_before) / abs(med_before) if med_before else None
    low = high = med_after - med_before if relative is None else relative
    if len(set(before) | set(after)) > 1 and len(before) > 1 and len(after) > 1:
        def moved(x, y, axis):
            shift = np.median(y, axis=axis) - np.median(x, axis=axis)
            return shift if relative is None else shift / np.abs(np.median(x, axis=axis))

        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
            warnings.simplefilter("ignore")
            interval = stats.bootstrap((list(before), list(after)), moved, vectorized=True, paired=False,
                                       confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                                       method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED)
                                       ).confidence_interval
        if math.isfinite(interval.low) and math.isfinite(interval.high):
            low, high = float(interval.low), float(interval.high)
    return Change(med_before, med_after, relative, low, high, p_value(before, after))


class Direction(str, Enum):
    """Which way is better; ANY: whichever way the ends differ."""

    LOWER = "lower-is-better"
    HIGHER = "higher-is-better"
    ANY = "any"

    def __str__(self) -> str:
        return self.value

    def worse(self, shift: float) -> bool:
        """Whether a change (after - before, or any multiple of it by a positive number) is for the worse
        (ANY: no way is worse)."""
        if self is Direction.LOWER:
            return shift > 0
        return self is Direction.HIGHER and shift < 0


@dataclass(frozen=True)
class Likeness:
    """Which end a commit's samples are like: "old", "new", or None while not known; and why."""

    end: str | None
    versus_old: Comparison
    versus_new: Comparison
    reason: str
    doubted: str | None = None  # the end the samples are likelier under but not consistent with: its own
                                # few samples may be off (more of them tell)


def pooled_scale(old: Sequence[float], new: Sequence[float]) -> float:
    """One spread for both ends: the MAD of every sample's deviation from its own end's median (normal-
    consistent; at least 1 % of the distance between the medians, so identical samples still work). Of an
    odd number of samples the median is one, whose deviation is 0 by construction, not a measured spread: it
    is left out (else five samples a side would understate the spread by a fifth)."""
    from scipy import stats

    at_old, at_new = statistics.median(old), statistics.median(new)
    deviations = [*_spread_of(old), *_spread_of(new)]
    return max(float(stats.median_abs_deviation(deviations, scale="normal")), abs(at_new - at_old) / 100,
               math.ulp(max(abs(at_old), abs(at_new), 1.0)))


def _spread_of(samples: Sequence[float]) -> list[float]:
    """samples' deviations from their median, without the median sample's own 0 (an odd number of them)."""
    centre = statistics.median(samples)
    ordered = sorted(samples)
    if len(ordered) % 2:
        del ordered[len(ordered) // 2]
    return [value - centre for value in ordered]


def overlapping(old: Sequence[float], new: Sequence[float]) -> bool:
    """Whether the ends' runs are no single peak each that a few runs of a commit can be weighed against, as on
    a machine whose runs fall into fast and slow phases (the H200's VM in round 6: a robust scale sees only the
    mode the median fell in):
    - the scale, pooled or of either end's own runs, is at least the distance between the ends' medians (noise
      larger than the change, or an end's runs split between two modes, its median between them);
    - runs within reach of the ends (`within_reach`: not outliers beyond both, which tell neither end) lie far
      from their own end's median: two over FAR scales, or one over LONE scales (the t model gives such a run
      1 chance in 10,000): a second mode;
    - more than a third of the ends' runs lie over FAR scales from their end's median, more than outliers
      make (10 % outliers put 4 of 10 runs that far 1 time in 80);
    - more of the ends' runs lie nearer the other end's median than their own than the t model expects
      (`crossing_p` <= CROSSING_P), or an end's runs fall into two clusters (`two_modes`): a second mode that
      inflated the pooled scale, so that no run lies far by it (issue 35: bench seeds 11 and 153 at 3 % noise).
    Which end a commit is like is then left to the rank tests alone, at STRICT_THRESHOLD, against the ends'
    own runs: no model of the runs is trusted, nor a pool of probes picked by their runs' phase."""
    at_old, at_new = statistics.median(old), statistics.median(new)
    scale, distance = pooled_scale(old, new), abs(at_new - at_old)
    kept_old, kept_new = within_reach(old, old, new), within_reach(new, old, new)
    if max(scale, pooled_scale(kept_old, kept_old), pooled_scale(kept_new, kept_new)) >= distance:
        return True
    far = [value for end, centre in ((old, at_old), (new, at_new)) for value in end
           if abs(value - centre) > FAR * scale]
    lone = [value for end, centre in ((old, at_old), (new, at_new)) for value in end
            if abs(value - centre) > LONE * scale]
    return len(far) * 3 > len(old) + len(new) or len(within_reach(far, old, new)) >= 2 or \
        bool(within_reach(lone, old, new)) or crossing_p(old, new) <= CROSSING_P or \
        two_modes(kept_old) or two_modes(kept_new)


def crossing_p(old: Sequence[float], new: Sequence[float]) -> float:
    """How likely as many of the ends' runs within reach as lie nearer the other end's median than their own
    are under the t model with the pooled scale (binomial tail; 1.0 when none does). Where an end's median fell
    in one mode and some of its runs in the other (bench seed 11: the bad end 594, 604, 879, 894, the good end
    939-1039), those runs lie near the other end, many more than the model's tails put there."""
    from scipy import stats

    at_old, at_new = statistics.median(old), statistics.median(new)
    kept = [(value, own, other) for end, own, other in ((old, at_old, at_new), (new, at_new, at_old))
            for value in within_reach(end, old, new)]
    crossed = sum(abs(value - other) < abs(value - own) for value, own, other in kept)
    if not crossed:
        return 1.0
    expected = float(stats.t.sf(abs(at_new - at_old) / (2 * pooled_scale(old, new)), T_DEGREES))
    return float(stats.binom.sf(crossed - 1, len(kept), expected))


def split_contrast(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per row of runs (a 2-d array): the sorted runs split in two (at least MODES_SIDE each) where the
    within-part sum of squares is least, the gap between the parts' means in units of their pooled standard
    deviation."""
    import numpy as np

    values = np.sort(rows, axis=1)
    n = values.shape[1]
    total, squares = np.cumsum(values, axis=1), np.cumsum(values ** 2, axis=1)
    best_ss = np.full(values.shape[0], np.inf)
    best = np.zeros(values.shape[0])
    for i in range(MODES_SIDE, n - MODES_SIDE + 1):
        lo_sum, lo_sq = total[:, i - 1], squares[:, i - 1]
        hi_sum, hi_sq = total[:, -1] - lo_sum, squares[:, -1] - lo_sq
        ss = lo_sq - lo_sum ** 2 / i + hi_sq - hi_sum ** 2 / (n - i)
        gap = hi_sum / (n - i) - lo_sum / i
        better = ss < best_ss
        best_ss = np.where(better, ss, best_ss)
        best = np.where(better, gap / np.sqrt(np.maximum(ss, 1e-300) / (n - 2)), best)
    return best


def trimmed(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row of runs sorted, its lowest and highest MODES_TRIM share (rounded down) left out."""
    import numpy as np

    cut = int(rows.shape[1] * MODES_TRIM)
    return np.sort(rows, axis=1)[:, cut:rows.shape[1] - cut]


@lru_cache(maxsize=None)
def _modes_bound(n: int, trim: bool) -> float:
    """The split contrast of n runs (`trimmed` first, with trim) that one normal peak's exceed with chance
    MODES_P (MODES_DRAWS seeded draws: reproducible)."""
    import numpy as np

    draws = np.random.default_rng(BOOTSTRAP_SEED).standard_normal((MODES_DRAWS, n))
    return float(np.quantile(split_contrast(trimmed(draws) if trim else draws), 1 - MODES_P))


def two_modes(samples: Sequence[float]) -> bool:
    """Whether one end's runs (outliers set aside) fall into two clusters further apart than one normal peak's
    runs do with chance MODES_P (split_contrast against _modes_bound), as they are or `trimmed` (either: a
    chance of 2 MODES_P at most): bench seed 153's bad end, 593-637 and 840-930, its median between them, where
    the pooled scale grew to most of the distance and no run lay far. Trimmed, 2x outliers that the grown
    scale's reach kept make no part's spread (bench seed 212 under the H200's phases with 10 % outliers: the
    bad end 622-638 and 924-958 with 312, 468 and 468; the good end 651-687 and 988-1020 with 330)."""
    import numpy as np

    rows = np.asarray([samples], dtype=float)
    return any(part.shape[1] >= 2 * MODES_SIDE and float(split_contrast(part)[0]) > _modes_bound(len(samples), trim)
               for part, trim in ((rows, False), (trimmed(rows), True)))


def within_reach(samples: Sequence[float], old: Sequence[float], new: Sequence[float]) -> list[float]:
    """samples less than FAR scales (pooled_scale) beyond both ends' medians: a run further out (a 2x outlier,
    a busy machine) is about as unlikely under either end, so it tells neither and is set aside."""
    at_old, at_new = statistics.median(old), statistics.median(new)
    reach = FAR * pooled_scale(old, new)
    return [value for value in samples if min(at_old, at_new) - reach <= value <= max(at_old, at_new) + reach]


def runs_to_tell(old: Sequence[float], new: Sequence[float]) -> float:
    """About how many runs of a commit, and of the other end, the strict rank test (one-sided p <=
    STRICT_THRESHOLD) needs to tell a commit like one end from the other, judged by the ends' own runs: A, the
    share of pairs in which the better-placed end's run lies beyond the other's (Mann-Whitney U / (n m)), gives
    k runs a side an expected z of (A - 1/2) sqrt(12 k^2 / (2k + 1)); the fewest k whose z reaches the
    threshold's (inf when the ends' runs rank no way). Two clean peaks (A = 1) need 8; the H200's phases
    (A about 3/4) about 30."""
    from scipy import stats

    higher, lower = (old, new) if statistics.median(old) > statistics.median(new) else (new, old)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        share = float(stats.mannwhitneyu(higher, lower).statistic) / (len(higher) * len(lower))
    if share <= 0.5:
        return math.inf
    z, c = float(stats.norm.isf(STRICT_THRESHOLD)), 12 * (share - 0.5) ** 2
    return math.ceil((2 * z * z + math.sqrt(4 * z ** 4 + 4 * c * z * z)) / (2 * c))


def log_likelihood_ratio(samples: Sequence[float], old: Sequence[float], new: Sequence[float]) -> float:
    """log P(samples | like new) - log P(samples | like old): scipy.stats.t likelihoods located at each end's
    median, with one scale for both (pooled_scale)."""
    import numpy as np
    from scipy import stats

    at_old, at_new = statistics.median(old), statistics.median(new)
    scale = pooled_scale(old, new)
    values = np.asarray(samples, dtype=float)
    return float(np.sum(stats.t.logpdf(values, T_DEGREES, loc=at_new, scale=scale)
                        - stats.t.logpdf(values, T_DEGREES, loc=at_old, scale=scale)))


def likeness(samples: Sequence[float], old: Sequence[float], new: Sequence[float], strict: bool = False) -> Likeness:
    """A commit is like one end when its samples are LIKELIHOOD_RATIO times likelier under that end than
    under the other, differ from the other end's (one-sided p <= LOW_THRESHOLD), are consistent with this
    one's (two-sided p > CONSISTENT, or `equivalent` within SAME_SHIFT of the ends' distance), and its median
    lies in the third of the way between the ends' medians nearest this end's; otherwise not known (more
    samples, or a skip). `strict` (the ends overlap): no likelihood ratio, the one-sided rank test at
    STRICT_THRESHOLD instead."""
    if not strict:
        samples, old, new = (within_reach(values, old, new) for values in (samples, old, new))
    versus_old, versus_new = compare(samples, old), compare(samples, new)
    ratio = log_likelihood_ratio(samples, old, new) if samples else 0.0
    median = statistics.median(samples) if samples else math.nan
    at_old, at_new = statistics.median(old), statistics.median(new)
    to_old, to_new = abs(median - at_old), abs(median - at_new)
    p = (f"likelihood ratio {math.exp(max(min(ratio, 700), -700)):.2g} for the new end; p = "
         f"{versus_old.p_value:.2g} against the old end, {versus_new.p_value:.2g} against the new end")
    # strict (the ends overlap: `overlapping`): the rank tests alone, every look of a capped commit counted
    bound, threshold = math.log(LIKELIHOOD_RATIO), STRICT_THRESHOLD if strict else LOW_THRESHOLD
    if strict:
        p += "; the ends' runs overlap: rank tests alone"
    towards, nearer = None, False
    if (strict or ratio <= -bound) and one_sided_p(samples, new, lower=at_old < at_new) <= threshold:
        towards, nearer = "old", to_old * 2 < to_new
    elif (strict or ratio >= bound) and one_sided_p(samples, old, lower=at_new < at_old) <= threshold:
        towards, nearer = "new", to_new * 2 < to_old
    margin, end = SAME_SHIFT * abs(at_new - at_old), old if towards == "old" else new
    consistent = bool(towards) and (
        (versus_old if towards == "old" else versus_new).p_value > CONSISTENT
        or (tight(old, margin) and tight(new, margin) and equivalent(samples, end, margin)))
    if towards and consistent and nearer:
        return Likeness(towards, versus_old, versus_new, f"like the {towards} end ({p})")
    doubted = towards if towards and not consistent else None
    if versus_old.result is Result.DIFFERENT and versus_new.result is Result.DIFFERENT:
        return Likeness(None, versus_old, versus_new, f"differs from both ends ({p})", doubted)
    return Likeness(None, versus_old, versus_new, f"not distinguishable from either end ({p})", doubted)


def tight(samples: Sequence[float], margin: float) -> bool:
    """Whether samples' interquartile range is under margin: one peak, not runs in two modes around a median
    that lies between them (where the distance between the ends' medians means nothing)."""
    q1, _, q3 = median_spread(samples)
    return q3 - q1 < margin


def equivalent(samples: Sequence[float], end: Sequence[float], margin: float) -> bool:
    """Whether the 95 % bootstrap interval of the change of samples' median from end's lies within +-margin."""
    if len(samples) < 2 or len(end) < 2:
        return False
    return change(end, samples).largest_shift() < margin


def first_samples(pool: int) -> int:
    """A commit's first batch: the fewest samples that can differ from a pool of `pool` samples at one-sided
    p <= LOW_THRESHOLD (the smallest Mann-Whitney p of k samples all beyond n is 1 / C(n + k, k): 4 against
    6 or 7, 3 against 8 or more), and never fewer than 3 (two samples far out by chance pass the likelihood
    ratio)."""
    k = 3
    while math.comb(pool + k, k) * LOW_THRESHOLD < 1:
        k += 1
    return k


def median_spread(samples: Sequence[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile) of samples."""
    if len(samples) < 2:
        value = samples[0] if samples else math.nan
        return value, value, value
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, statistics.median(samples), q3


@dataclass(frozen=True)
class PerfSettings:
    """`run --metric`: what a performance hunt measures and how it decides."""

    metric: str
    direction: Direction = Direction.ANY
    min_change: float = 0.01   # the ends must differ by this fraction at least (0.01: 1 %)
    warmup: int = 0            # each commit's first runs, discarded
    max_samples: int = 20      # samples of one commit at most before it is skipped as not distinguishable
    parallel: int = 1          # runs of one commit side by side (free slots)

    ENDPOINT_START = 5         # samples of each end before they are first compared
    PROBE_STEP = 1             # more samples of an undecided commit, per round
    ENDPOINT_REPEAT_EVERY = 3  # one end runs again with every third probe (alternating good and bad)

    @property
    def key_parts(self) -> dict:
        """What the stored samples depend on (the verdict cache key's perf part): the metric. How they are
        judged (direction, minimum change, warm-up, caps) is applied to them afresh on every run."""
        return {"metric": self.metric}

    def cli_args(self) -> list[str]:
        """These settings as `bisector run` options (a continuation command printed for running by hand)."""
        direction = [] if self.direction is Direction.ANY else [f"--{self.direction}"]
        return ["--metric", self.metric, *direction, "--min-change", f"{self.min_change * 100:g}",
                "--warmup", str(self.warmup), "--max-samples", str(self.max_samples)]

    def to_json(self) -> dict:
        return {"metric": self.metric, "direction": str(self.direction), "min_change": self.min_change,
                "warmup": self.warmup, "max_samples": self.max_samples}

    @classmethod
    def from_json(cls, data: Mapping) -> PerfSettings:
        """The settings a result keeps (how many runs went side by side is not kept: parallel reads 1)."""
        return cls(data["metric"], Direction(data["direction"]), data["min_change"], data["warmup"],
                   data["max_samples"])

    def plan(self, testable: int) -> tuple[int, int]:
        """Runs a hunt over `testable` commits takes: (fewest, most)."""
        probes = math.ceil(math.log2(testable + 1)) if testable else 0
        fewest = (2 * (self.warmup + self.ENDPOINT_START) + probes * (self.warmup + first_samples(self.ENDPOINT_START))
                  + probes // self.ENDPOINT_REPEAT_EVERY)
        most = 2 * (self.warmup + self.max_samples) + probes * (self.warmup + 2 * self.max_samples)
        return fewest, most


@dataclass(frozen=True)
class PerfCommit:
    """A commit of a performance hunt as its result keeps it: its runs, its samples (after the warm-up) with
    their median and quartiles, its change from the old end, and the verdict the hunt gave it."""

    sha: str
    role: str                      # endpoint | probe
    runs: int
    samples: tuple[float, ...]
    verdict: str                   # an end: its name; a probe: the name of the end it is like, skip or undecided
    median: float | None = None    # None: no samples
    q1: float | None = None
    q3: float | None = None
    change: Change | None = None   # from the old end, with two samples or more
    reason: str | None = None      # a probe: why its verdict
    p_old: float | None = None     # a probe: the p-values of its samples against the old end's, the new end's
    p_new: float | None = None

    def to_json(self) -> dict:
        entry: dict[str, Any] = {"sha": self.sha, "role": self.role, "runs": self.runs, "samples": list(self.samples)}
        if self.median is not None:
            entry.update(median=self.median, q1=self.q1, q3=self.q3)
        if self.change is not None:
            entry["change"] = self.change.to_json()
        entry["verdict"] = self.verdict
        if self.reason is not None:
            entry["reason"] = self.reason
        if self.p_old is not None:
            entry["p_old"], entry["p_new"] = self.p_old, self.p_new
        return entry

    @classmethod
    def from_json(cls, data: Mapping) -> PerfCommit:
        return cls(data["sha"], data["role"], data["runs"], tuple(data["samples"]), data["verdict"],
                   data.get("median"), data.get("q1"), data.get("q3"),
                   Change.from_json(data["change"]) if data.get("change") else None, data.get("reason"),
                   data.get("p_old"), data.get("p_new"))


@dataclass(frozen=True)
class PerfRecord:
    """What a result keeps of a performance hunt (policies.PerfPolicy.record): the settings, the ends' names and
    change, and every tested commit, in history order."""

    settings: PerfSettings
    old_name: str
    new_name: str
    commits: tuple[PerfCommit, ...]
    change: Change | None = None  # from the old end to the new; None: an end has no samples

    def to_json(self) -> dict:
        record: dict[str, Any] = {**self.settings.to_json(), "old_name": self.old_name, "new_name": self.new_name,
                                  "commits": [commit.to_json() for commit in self.commits]}
        if self.change is not None:
            record["change"] = self.change.to_json()
        return record

    @classmethod
    def from_json(cls, data: Mapping) -> PerfRecord:
        return cls(PerfSettings.from_json(data), data["old_name"], data["new_name"],
                   tuple(PerfCommit.from_json(commit) for commit in data["commits"]),
                   Change.from_json(data["change"]) if data.get("change") else None)
