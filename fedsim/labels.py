"""The labels every layer writes beside its numbers, and what each one says about privacy.

A row of ``metrics.jsonl``, ``summary.json``, ``data.json``, a strategy's metrics, the trackers' scalars and the
plots all tell the reader which values epsilon covers and which it does not, and why a value is missing. They do
it with these few labels, so the strategies that produce the values and the report that writes them agree on
them without one importing the other. This module imports nothing from fedsim: any module may use it.
"""

from __future__ import annotations

#: Where a row, ``summary.json``, ``data.json`` and the strategies' metrics keep what epsilon does NOT cover: exact
#: facts about the clients (the realised cohort, failures and rejections, training-client metrics and the gap
#: computed from them, un-noised update norms, the partition's statistics, timings). A value outside this key is a
#: noised release, a function of the noised releases, or a public setting; a value under it is as private as the
#: clients' data, and publishing it spends privacy that no accountant has counted.
NON_PRIVATE = "non_private"

#: Beside a key whose value was infinite and is written as JSON ``null``: ``"<key>_reason"`` says why the number is
#: missing, so a reader can tell "unbounded" (a reason beside it) from "undefined" (``null`` alone, a NaN).
REASON_SUFFIX = "_reason"

#: The reason written for +inf (``"-infinite"`` for -inf): for an epsilon, that no accountant can bound the
#: privacy loss at that delta (no noise, or too little for the rounds run), i.e. the release is not private; it is
#: never a large finite epsilon. NaN (undefined: nothing computed) is ``null`` with no reason.
INFINITE = "infinite"
