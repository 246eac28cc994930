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


#: The pages of the documentation site (``docs/`` in the repository, built by ``make docs``) that hold the longer
#: explanation an error message points to, by topic: ``(page under docs/, heading anchor)``. The anchors are the
#: headings' MyST slugs; ``tests/test_docs_pointers.py`` checks that every page and heading exists.
DOCS: dict[str, tuple[str, str]] = {
    "neighbouring": ("explanations/privacy.md", "the-neighbouring-relation"),
    "distributed": ("explanations/privacy.md", "distributed-noise"),
    "engine": ("how-to/engines.md", "pick-an-engine-enginename"),
    "training-path": ("how-to/engines.md", "pick-a-training-path-enginevectorize"),
    "own-model": ("tutorials/own-model.md", "more-on-the-contract"),
    "ray-cluster": ("how-to/ray-cluster.md", ""),
    "resume": ("how-to/resume.md", "what-cannot-be-resumed-or-extended"),
}


def see_docs(topic: str) -> str:
    """``see docs/<page>#<anchor>``: where the documentation explains ``topic`` (a key of :data:`DOCS`) at length,
    for the end of an error message (the same path names the page in the repository and, as ``.html``, on the
    built site)."""
    page, anchor = DOCS[topic]
    return f"see docs/{page}" + (f"#{anchor}" if anchor else "")
