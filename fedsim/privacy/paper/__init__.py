"""What analyses the papers of He, Wang and Tao, on top of the certified accountant (:mod:`fedsim.privacy`).

* :mod:`.generalization`: Theorem 1 (UAI with Lemma 1's constants, arXiv), the per-round statement from the
  certified (epsilon, delta), Corollary 3's O(1/sqrt(C)) curve, the smallest population with a statement;
* :mod:`.audit`: why the closed-form paper bounds (UAI Theorem 7, arXiv Theorem 8, evaluated by the registry's
  ``igmm`` / ``dp-fl-thm8`` accountants) are not certificates, in numbers;
* :mod:`.calibration`: the noise multiplier that meets a target epsilon, for any accountant of the registry.
"""

from .audit import audit_closed_forms
from .calibration import calibrate_noise
from .generalization import corollary3_curve, generalization_statement, min_population, statement_curve

__all__ = [
    "audit_closed_forms",
    "calibrate_noise",
    "corollary3_curve",
    "generalization_statement",
    "min_population",
    "statement_curve",
]
