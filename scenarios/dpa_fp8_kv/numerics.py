"""Compare the greedy decode of the run under test with the reference run's. Pure.

Per sequence: token agreement is the share of generated tokens before the first one that differs; the
top-k lists are compared only where both runs saw the same context (up to and including the first
differing position): overlap is the share of the reference's top-k tokens the run under test also has,
and the logprob delta the largest |difference| on tokens in both lists. The run's figures are the means
over sequences (agreement) and over compared positions (overlap), and the largest delta.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from scenarios.dpa_fp8_kv.child import NUMERICS_MARKER

WORST_SHOWN = 5  # sequences listed in the step's details and log
SIGNATURE = "numerics: disagrees with the reference run"  # the failure kind --signature auto learns


def decoded(output: str) -> list[dict] | None:
    """The child's per-sequence record from its output (the last NUMERICS_MARKER line), or None."""
    for line in reversed(output.splitlines()):
        at = line.find(NUMERICS_MARKER + " ")
        if at >= 0:
            try:
                return json.loads(line[at + len(NUMERICS_MARKER) + 1:])["sequences"]
            except (ValueError, KeyError, TypeError):
                return None
    return None


@dataclass(frozen=True)
class Comparison:
    sequences: list[dict]  # per sequence: seq, tokens, agreement, overlap, max_logprob_delta, first_difference
    token_agreement: float
    topk_overlap: float
    max_logprob_delta: float
    topk: int

    def disagreeing(self, min_topk_overlap: float) -> list[dict]:
        return [seq for seq in self.sequences
                if seq["first_difference"] is not None or seq["overlap"] < min_topk_overlap]

    def worst(self, count: int = WORST_SHOWN) -> list[dict]:
        return sorted(self.sequences, key=lambda seq: (seq["agreement"], seq["overlap"],
                                                       -seq["max_logprob_delta"]))[:count]

    def summary(self) -> dict:
        return {"sequences": len(self.sequences), "token_agreement": round(self.token_agreement, 4),
                "topk": self.topk, "topk_overlap": round(self.topk_overlap, 4),
                "max_logprob_delta": round(self.max_logprob_delta, 4)}


def compare(test: list[dict], reference: list[dict], topk: int) -> Comparison:
    """test against reference, sequence by sequence (the same prompts in the same order)."""
    if len(test) != len(reference):
        raise ValueError(f"{len(test)} sequences against {len(reference)} in the reference")
    rows, agreements, overlaps, deltas = [], [], [], []
    for n, (mine, theirs) in enumerate(zip(test, reference)):
        length = min(len(mine["tokens"]), len(theirs["tokens"]))
        first = next((i for i in range(length) if mine["tokens"][i] != theirs["tokens"][i]), None)
        same_context = length if first is None else first + 1
        seq_overlaps, seq_delta = [], 0.0
        for position in range(min(same_context, len(mine["top"]), len(theirs["top"]))):
            overlap, delta = _position(mine["top"][position], theirs["top"][position], topk)
            seq_overlaps.append(overlap)
            seq_delta = max(seq_delta, delta)
        overlaps += seq_overlaps
        deltas.append(seq_delta)
        agreements.append((length if first is None else first) / length if length else 0.0)
        rows.append({"seq": n, "tokens": length, "first_difference": first, "agreement": round(agreements[-1], 4),
                     "overlap": round(sum(seq_overlaps) / len(seq_overlaps), 4) if seq_overlaps else 0.0,
                     "max_logprob_delta": round(seq_delta, 4)})
    agreement = sum(agreements) / len(agreements) if agreements else 0.0
    return Comparison(rows, agreement, sum(overlaps) / len(overlaps) if overlaps else 0.0,
                      max(deltas, default=0.0), topk)


def _position(mine: list, theirs: list, topk: int) -> tuple[float, float]:
    """(overlap, largest |logprob difference| on shared tokens) of one position's top-k lists; a NaN
    logprob counts as an infinite difference."""
    mine_lp = {token: logprob for token, logprob in mine[:topk]}
    theirs_lp = {token: logprob for token, logprob in theirs[:topk]}
    if not theirs_lp:
        return 0.0, math.inf
    shared = mine_lp.keys() & theirs_lp.keys()
    delta = 0.0
    for token in shared:
        difference = abs(mine_lp[token] - theirs_lp[token])
        delta = max(delta, math.inf if math.isnan(difference) else difference)
    return len(shared) / len(theirs_lp), delta


def judge(comparison: Comparison, min_token_agreement: float, min_topk_overlap: float,
          tested: str, reference: str) -> tuple[bool, str]:
    """(agrees, reason): the pair disagrees when either figure falls below its bound."""
    off = comparison.disagreeing(min_topk_overlap)
    figures = (f"token agreement {comparison.token_agreement:.3f}, top-{comparison.topk} overlap "
               f"{comparison.topk_overlap:.3f}, max |Δlogprob| {comparison.max_logprob_delta:.3f}")
    agrees = (comparison.token_agreement >= min_token_agreement
              and comparison.topk_overlap >= min_topk_overlap)
    if agrees:
        return True, (f"numerics: {tested} agrees with {reference} ({figures}; bounds {min_token_agreement:g}/"
                      f"{min_topk_overlap:g}; {len(off)} of {len(comparison.sequences)} sequences differ)")
    worst = comparison.worst(1)[0]
    return False, (f"numerics: {tested} disagrees with {reference} on {len(off)} of {len(comparison.sequences)} "
                   f"sequences ({figures}; bounds {min_token_agreement:g}/{min_topk_overlap:g}); worst: "
                   f"sequence {worst['seq']}, first different token at {worst['first_difference']}, "
                   f"overlap {worst['overlap']:.2f}")


def report_lines(comparison: Comparison, tested: str, reference: str) -> list[str]:
    """What the step's log ends with: the figures and the worst sequences."""
    lines = [f"===== numerics: {tested} against {reference}: " + json.dumps(comparison.summary())]
    for seq in comparison.worst():
        lines.append(f"===== worst: sequence {seq['seq']}: first different token at {seq['first_difference']} "
                     f"of {seq['tokens']}, top-{comparison.topk} overlap {seq['overlap']:.3f}, "
                     f"max |Δlogprob| {seq['max_logprob_delta']:.4f}")
    return lines


def calibrated_bounds(figures: list[dict]) -> dict[str, str]:
    """Bounds from clean pairs' summaries (the good end's runs): the worst clean figure less its own
    distance from perfect agreement, and at least 0.02 (noise seen once may come twice as large)."""
    bounds = {}
    for option, key in (("min_token_agreement", "token_agreement"), ("min_topk_overlap", "topk_overlap")):
        seen = [figure[key] for figure in figures if key in figure]
        if seen:
            worst = min(seen)
            bounds[option] = f"{max(0.0, worst - max(0.02, 1 - worst)):.3f}"
    return bounds
