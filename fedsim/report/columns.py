"""What a run directory holds, and what every column of a row says about privacy: the one declaration.

docs/reference/run-directory.md is generated from :data:`RUN_FILES`, :data:`ROW_COLUMNS` and
:data:`NON_PRIVATE_COLUMNS`, and tests/report/test_columns.py runs real scenarios and checks every key of every row
against them, so a column added to a row without a line here fails a test, and the page cannot drift from the rows.

A row's top level holds what epsilon covers (:data:`RELEASE`, :data:`DERIVED`) or needs no cover
(:data:`PUBLIC`); everything else is under ``non_private`` (:data:`fedsim.labels.NON_PRIVATE`): exact facts about
the clients, which a deployment does not report (they are dropped without diagnostics).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.labels import INFINITE, NON_PRIVATE, REASON_SUFFIX

__all__ = [
    "DERIVED",
    "KINDS",
    "NON_PRIVATE_COLUMNS",
    "NON_PRIVATE_KIND",
    "PUBLIC",
    "RELEASE",
    "ROW_COLUMNS",
    "RUN_FILES",
    "Column",
    "RunFile",
    "documented",
]

#: a value drawn with noise and recorded in ``ledger.json``: epsilon accounts for it
RELEASE = "noised release"
#: computed from the noised releases (and public parameters) only: post-processing, covered by the same epsilon
DERIVED = "function of releases"
#: a setting, or a function of settings and the accountant alone (epsilon itself): it reveals nothing of a client
PUBLIC = "public"
#: an exact fact about clients, under ``non_private``: epsilon does NOT cover it
NON_PRIVATE_KIND = "non-private"
#: what each kind means, in the order the page explains them
KINDS: dict[str, str] = {
    RELEASE: "drawn with noise and recorded in ledger.json; the certified epsilon accounts for it",
    DERIVED: "computed from the noised releases and public parameters only (post-processing): covered by epsilon",
    PUBLIC: "a setting, or a function of settings and the accountant alone; it tells nothing about a client",
    NON_PRIVATE_KIND: "an exact fact about clients, kept under non_private: epsilon does not cover it",
}

#: the rows' condition on evaluation: a column computed when the model is evaluated
_EVALUATED = "evaluated rounds (engine.eval_every)"


@dataclass(frozen=True)
class Column:
    """One key of a row: what kind of value it is (:data:`KINDS`), what it means, and ``when`` it appears (None:
    in every row; else the setting or situation that adds it)."""

    kind: str
    meaning: str
    when: str | None = None


@dataclass(frozen=True)
class RunFile:
    """One file (or folder) of a run directory: what it holds, and ``when`` it is written (None: every run)."""

    meaning: str
    when: str | None = None


#: the run directory's files, in the order a run writes them
RUN_FILES: dict[str, RunFile] = {
    "provenance.json": RunFile(
        "written before the first round: fedsim's version, the git commit (and whether the checkout had "
        "uncommitted changes) and the versions of torch, flwr, ray, dp-accounting, numpy, scipy, pydantic"
    ),
    "config.toml": RunFile(
        "the resolved scenario, every default written out (privacy.randomness says where the cohort and the noise "
        "came from; comments say where a calibrated noise multiplier came from); `fedsim run config.toml` reruns it"
    ),
    "data.json": RunFile(
        "the partition: settings and public sizes at the top level, exact statistics of the clients' data "
        "(examples per client, label entropy, totals) under non_private"
    ),
    "metrics.jsonl": RunFile(
        "one JSON row per round, flushed as the round ends (an interrupted run keeps every finished round); "
        "its columns are listed below"
    ),
    "ledger.json": RunFile(
        "every noised release of the run (round, mechanism, name): what the certified epsilon is computed from; "
        "a strategy given it continues the budget"
    ),
    "checkpoint.npz": RunFile(
        "the model and the strategy's state after the last checkpointed round: `fedsim run --resume` continues "
        "from it to the same result",
        "engine.checkpoint_every > 0 (default 10)",
    ),
    "summary.json": RunFile(
        "the last row's values, the noise settings, privacy_scope (what epsilon covers, and every file, plot and "
        "console line that shows what it does not), the paper bounds' audit, the engine used, the run's warnings; "
        "under non_private the timings and, after a stop by client failures (exit 4), stopped_by, stopped_reason and "
        "rounds_completed (a stop by the privacy budget, exit 3, is a function of public parameters and stays at "
        "the top level); final_non_private and non_private_failed_clients are named so"
    ),
    "model.npz": RunFile("the final model as a flat float64 vector (`np.load(path)['weights']`)"),
    "model.pt": RunFile(
        "the final model as a PyTorch state_dict of the scenario's model (`fedsim.load_model` rebuilds it)",
        "the model could be built in this process (a shipped model or an importable factory)",
    ),
    "run.log": RunFile(
        "what libraries said (warnings) while the run trained and evaluated, one stamped entry a line",
        "a library warned during the run",
    ),
    "plots/epsilon.png": RunFile(
        "certified epsilon per round by accountant, with the paper bounds beside it"
    ),
    "plots/accuracy.png": RunFile(
        "held-out and training-client (non-private) accuracy per round and their gap"
    ),
    "plots/loss.png": RunFile("held-out and training-client (non-private) loss per round and their gap"),
    "plots/accuracy_vs_epsilon.png": RunFile("held-out accuracy against the certified epsilon spent"),
    "plots/generalization.png": RunFile(
        "the bound on the gap implied by epsilon beside the measured (non-private) gap"
    ),
    "plots/perplexity.png": RunFile(
        "held-out and training-client (non-private) perplexity per round",
        "a sequence task with the default cross-entropy loss",
    ),
    "plots/attack.png": RunFile(
        "the membership-inference attack's accuracy and AUC per round (non-private)",
        "report.membership_attack = true",
    ),
    "plots/agnostic.png": RunFile(
        "agnostic FL's mixture weights and noised domain losses per round, held-out loss per domain",
        "agnostic.enabled = true",
    ),
    "tensorboard/": RunFile(
        "the rows' scalars (one step per round) and the config as TensorBoard event files",
        "report.tensorboard = true",
    ),
}

#: the top level of a row of ``metrics.jsonl`` (and of ``fedsim.run(...).rows``)
ROW_COLUMNS: dict[str, Column] = {
    "round": Column(PUBLIC, "the round, from 1"),
    "private": Column(
        PUBLIC, "whether every release of the round was noised (false: the non-private baseline)"
    ),
    "clip": Column(
        PUBLIC,
        "the L2 clip of the round's updates (0: none); with adaptive clipping, a function of earlier releases",
    ),
    "noise_multiplier": Column(
        PUBLIC, "z as the run used it (calibrated where privacy.target_epsilon is given)"
    ),
    "noise_std_sum": Column(
        PUBLIC, "std of the noise added to the round's sum (correlated noise: a combination of draws)"
    ),
    "noise_std_draw": Column(PUBLIC, "std of one fresh draw: noise_multiplier * clip"),
    "update_norm": Column(DERIVED, "L2 norm of the released (noised) mean update"),
    "epsilon": Column(PUBLIC, "certified epsilon after this round at delta (dp-accounting)"),
    "delta": Column(PUBLIC, "the delta epsilon is certified at"),
    "accountant": Column(PUBLIC, "the certified accountant asked (privacy.accountant)"),
    "accountant_used": Column(
        PUBLIC,
        "the accountant that answered instead",
        "the asked one would not fit in memory (PLD fell back)",
    ),
    "accountant_note": Column(
        PUBLIC, "why the accountant fell back", "the asked one would not fit in memory (PLD fell back)"
    ),
    "randomness": Column(PUBLIC, "where the cohort and the noise came from: seeded or os-entropy"),
    "local_training": Column(
        PUBLIC,
        "the training path chosen for the model (engine.vectorize resolved: per-layer, vmap or loop)",
        "the engine says (local and ray)",
    ),
    "heldout_loss": Column(
        DERIVED, "client-level mean loss of the released model on held-out clients", _EVALUATED
    ),
    "heldout_accuracy": Column(DERIVED, "client-level mean accuracy on held-out clients", _EVALUATED),
    "heldout_perplexity": Column(DERIVED, "held-out perplexity", "a sequence task; " + _EVALUATED),
    "heldout_metric": Column(DERIVED, "held-out mean of model.metric", "model.metric is set; " + _EVALUATED),
    "heldout_clients_evaluated": Column(
        PUBLIC,
        "held-out clients in the fixed evaluation sample",
        "engine.eval_clients below the held-out count",
    ),
    "domains_heldout": Column(
        DERIVED,
        "held-out loss and accuracy per domain (a list, one entry a domain)",
        "data.domains; " + _EVALUATED,
    ),
    "worst_domain_heldout_loss": Column(
        DERIVED, "the largest held-out loss over the domains", "data.domains; " + _EVALUATED
    ),
    "paper_epsilon_igmm": Column(
        PUBLIC, "the IGMM paper's Theorem 7 as printed: a paper bound, not a certificate"
    ),
    "paper_epsilon_igmm-corrected": Column(PUBLIC, "a valid closed-form bound for all of a round's releases"),
    "generalization": Column(
        PUBLIC, "the statement P(|gap| > a) < b epsilon implies: status, a, b and what it used"
    ),
    "empirical_privacy": Column(
        DERIVED,
        "canary estimates of epsilon (Andrew et al.; Steinke et al.'s one-run lower bound): not certificates",
        "privacy.canaries > 0; " + _EVALUATED,
    ),
    "unclipped_fraction_noised": Column(
        RELEASE, "the noised fraction of unclipped updates", "privacy.adaptive_clip = true"
    ),
    "next_clip": Column(DERIVED, "the clip of the next round", "privacy.adaptive_clip = true"),
    "lambda_used": Column(DERIVED, "the mixture weights this round trained with", "agnostic.enabled = true"),
    "weight_scale": Column(
        DERIVED,
        "the largest client weight: lambda over the expected clients per domain",
        "agnostic.enabled = true",
    ),
    "domain_loss_noised": Column(RELEASE, "the noised per-domain mean losses", "agnostic.enabled = true"),
    "lambda_next": Column(DERIVED, "the mixture weights after the ascent step", "agnostic.enabled = true"),
    "wrapped_coordinates": Column(
        DERIVED,
        "coordinates whose secure sum wrapped the modulus (-1: unknown)",
        "a mechanism whose clients encode",
    ),
    "grid_step": Column(PUBLIC, "the quantisation step of the encoding", "a mechanism whose clients encode"),
    NON_PRIVATE: Column(
        NON_PRIVATE_KIND, "the exact facts about clients listed below", "diagnostics (always in simulation)"
    ),
}

#: the keys under a row's ``non_private``: all of kind :data:`NON_PRIVATE_KIND`
NON_PRIVATE_COLUMNS: dict[str, Column] = {
    name: Column(NON_PRIVATE_KIND, meaning, when)
    for name, meaning, when in (
        ("cohort", "clients sampled this round", None),
        ("received", "replies summed", None),
        ("rejected", "sampled clients whose reply was not summed", None),
        ("failed", "rejected clients by reason", None),
        (
            "server_noise_std",
            "the noise std the server added (distributed noise: reveals missing shares)",
            None,
        ),
        ("clipped_fraction", "the exact fraction of updates clipped", None),
        ("median_update_norm", "the median un-noised update norm", None),
        ("quantisation_error_norm", "the clients' exact rounding error", "a mechanism whose clients encode"),
        ("train_time_s", "seconds the cohort trained", None),
        ("client_train_loss", "mean training loss the clients reported", None),
        ("local_training_used", "the paths the round's clients actually trained on", "the engine says"),
        ("train_clients_evaluated", "training clients in the evaluation sample", "engine.eval_clients"),
        ("train_loss", "client-level mean loss on training clients", _EVALUATED),
        ("train_accuracy", "client-level mean accuracy on training clients", _EVALUATED),
        ("train_perplexity", "perplexity on training clients", "a sequence task; " + _EVALUATED),
        ("train_metric", "model.metric on training clients", "model.metric is set; " + _EVALUATED),
        ("gap_loss", "held-out minus training loss", _EVALUATED),
        ("gap_accuracy", "training minus held-out accuracy", _EVALUATED),
        ("domains_train", "training loss and accuracy per domain", "data.domains; " + _EVALUATED),
        (
            "worst_domain_train_loss",
            "the largest training loss over the domains",
            "data.domains; " + _EVALUATED,
        ),
        ("attack", "the membership-inference attack's accuracy and AUC", "report.membership_attack = true"),
        ("round_time_s", "seconds the round took", None),
    )
}


def documented(key: str, columns: dict[str, Column]) -> Column | None:
    """The declaration of ``key`` in ``columns``; a ``<key>_reason`` written beside a documented column whose value
    was infinite (:func:`fedsim.report.rundir.json_safe`: ``"infinite"``) is that column's; None: undocumented."""
    if key in columns:
        return columns[key]
    if key.endswith(REASON_SUFFIX) and key[: -len(REASON_SUFFIX)] in columns:
        base = columns[key[: -len(REASON_SUFFIX)]]
        return Column(base.kind, f"why the value beside it is null: {INFINITE!r}", "the value is infinite")
    return None
