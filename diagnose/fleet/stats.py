"""The per-node test: is a node's failure count far above what the fleet's failure rate predicts?

A one-sided exact binomial test. Under the null hypothesis every job-on-a-node fails independently with the fleet's
rate ``p`` (blamed job-node pairs / all job-node pairs in the window), so a node that ran ``n`` jobs has
``X ~ Binomial(n, p)`` failures blamed on it; the p-value is ``P(X >= k)`` for the ``k`` observed. With ``m`` nodes
tested at once, a node is flagged when its p-value is below ``alpha / m`` (Bonferroni: the chance of flagging any
healthy node stays below ``alpha``) and ``k >= min_failures`` (one unlucky job never drains a node).
"""

from __future__ import annotations

import math

TEST_NAME = "one-sided exact binomial test against the fleet failure rate, Bonferroni-corrected"


def binomial_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, summed in log space (exact, no scipy)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    lg_n1 = math.lgamma(n + 1)
    terms = [lg_n1 - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q for i in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def flag(k: int, n: int, p: float, tested: int, alpha: float, min_failures: int) -> tuple[float, bool]:
    """(p-value, flagged) for one node; ``tested`` is the number of nodes tested (the Bonferroni divisor)."""
    p_value = binomial_sf(k, n, p)
    return p_value, k >= min_failures and p_value < alpha / max(1, tested)
