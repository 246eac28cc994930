"""The private round's runtime operations: sampling, clipping, noise, partial sums.

The one implementation of a round's sampling, clipping and noise (``docs/architecture.md``): every engine (the
Ray engine, the in-process engine, Flower's Simulation Engine, a deployed SuperLink) goes through these functions;
the strategies in :mod:`fedsim.strategies` decide *when* to call them, :mod:`fedsim.privacy` accounts what they
release.

Randomness (:mod:`fedsim.round.randomness`): every stream comes from its own generator seeded by
``(seed, round, stream[, client])``, never from Python's or NumPy's global generators, so results do not depend
on call order or worker count. With ``seed=None`` every value comes from the operating system's entropy
(``os.urandom``): deployments use that.
"""

from .correlated import (
    BandedMatrixFactorization,
    BufferedToeplitz,
    CorrelatedNoise,
    TreeAggregation,
)
from .noise import (
    NOISE_PLACEMENTS,
    NOISE_PURPOSES,
    NOISE_SOURCES,
    PLACEMENTS,
    NoiseSource,
    Placement,
    check_declared,
    decoded_mean,
    make_noise_source,
    noise_share_std,
    placement,
    private_mean,
    register_noise_source,
)
from .partial import FAILURES, PartialSum, bounded_value, clip_update, flatten, unflatten
from .plan import CLIP_COUNT, RoundPlan
from .randomness import (
    OS_ENTROPY,
    RANDOMNESS,
    SEEDED,
    STREAM_CLIENT,
    STREAM_COUNT_NOISE,
    STREAM_EVALUATION,
    STREAM_LOSS_NOISE,
    STREAM_NOISE,
    STREAM_NOISE_SHARE,
    STREAM_ROTATION,
    STREAM_ROUNDING,
    STREAM_SAMPLING,
    OsEntropyGenerator,
    make_rng,
    randomness_kind,
)
from .sampling import (
    ADD_REMOVE,
    SAMPLERS,
    Sampler,
    ScheduledSampler,
    check_cohort,
    id_array,
    make_sampler,
    register_sampler,
    sample_cohort,
    sampler_class,
    sampling_names,
)

__all__ = [
    "ADD_REMOVE",
    "CLIP_COUNT",
    "FAILURES",
    "NOISE_PLACEMENTS",
    "NOISE_PURPOSES",
    "NOISE_SOURCES",
    "OS_ENTROPY",
    "PLACEMENTS",
    "RANDOMNESS",
    "SAMPLERS",
    "SEEDED",
    "STREAM_CLIENT",
    "STREAM_COUNT_NOISE",
    "STREAM_EVALUATION",
    "STREAM_LOSS_NOISE",
    "STREAM_NOISE",
    "STREAM_NOISE_SHARE",
    "STREAM_ROTATION",
    "STREAM_ROUNDING",
    "STREAM_SAMPLING",
    "BandedMatrixFactorization",
    "BufferedToeplitz",
    "CorrelatedNoise",
    "NoiseSource",
    "OsEntropyGenerator",
    "PartialSum",
    "Placement",
    "RoundPlan",
    "Sampler",
    "ScheduledSampler",
    "TreeAggregation",
    "bounded_value",
    "check_cohort",
    "check_declared",
    "clip_update",
    "decoded_mean",
    "flatten",
    "id_array",
    "make_noise_source",
    "make_rng",
    "make_sampler",
    "noise_share_std",
    "placement",
    "private_mean",
    "randomness_kind",
    "register_noise_source",
    "register_sampler",
    "sample_cohort",
    "sampler_class",
    "sampling_names",
    "unflatten",
]
