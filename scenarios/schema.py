"""The scenario schema: every value a run depends on, validated by pydantic.

A scenario is a TOML file whose top-level keys and tables mirror :class:`Scenario`. Unknown keys are
rejected (a typo must never silently fall back to a default, least of all a privacy parameter).

The choices are those of the registries that implement them (datasets, partitioners, models, samplers, noise
placements, the certified accountants, server optimizers, training paths), and the rules for a round's parameters are
:mod:`fedsim.validation`'s, the same the library API applies.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fedsim import factories
from fedsim.data import DATASETS, PARTITIONERS
from fedsim.labels import see_docs
from fedsim.models import MODEL_FACTORIES, MODELS
from fedsim.privacy.accountants import DEFAULT_ACCOUNTANT, certified_methods
from fedsim.privacy.settings import AdaptiveClipping, PrivacySettings, SecureAggregation, canaries_refused
from fedsim.registry import engine_entry, engine_names
from fedsim.round import (
    NOISE_PLACEMENTS,
    NOISE_SOURCES,
    RANDOMNESS,
    check_cohort,
    sampling_names,
)
from fedsim.round.mechanism_options import MOVED_OPTIONS, check_mechanism_options, option_names
from fedsim.strategies.server_opt import SERVER_OPTIMIZERS
from fedsim.training.vectorized import VECTORIZE
from fedsim.validation import (
    NO_NOISE,
    NOISE_MULTIPLIER_RANGE,
    PrivacyInputError,
    composed_noise_multiplier,
    noise_multiplier_value,
)

Partitioner = Literal[PARTITIONERS]  # type: ignore[valid-type]
ModelName = Literal[MODELS]  # type: ignore[valid-type]
NoisePlacement = Literal[NOISE_PLACEMENTS]  # type: ignore[valid-type]
Randomness = Literal[RANDOMNESS]  # type: ignore[valid-type]
Vectorize = Literal[VECTORIZE]  # type: ignore[valid-type]
ServerOptimizerName = Literal[SERVER_OPTIMIZERS]  # type: ignore[valid-type]


def _registered(
    field: str, names: Callable[[], tuple[str, ...]], docs: str | None = None
) -> Callable[[Any], str]:
    """A validator accepting the names a registry holds when the scenario is validated (so a sampler, noise
    mechanism, accountant or engine registered from outside fedsim is accepted), with the library's message;
    ``docs``: the topic of :data:`fedsim.labels.DOCS` whose page explains the choice, named in the message."""

    def check(value: Any) -> str:
        allowed = tuple(names())
        if value not in allowed:  # the loader adds the field and the value received
            raise ValueError(f"must be one of {', '.join(allowed)}" + (f"; {see_docs(docs)}" if docs else ""))
        return value

    check.names = names  # type: ignore[attr-defined]  # the reference pages list the names (scenario_keys)
    return check


#: the largest float32: training runs in float32, so a step size above it cannot even be applied
FLOAT32_MAX = 3.4028234663852886e38


def _members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None`` included), or the annotation alone."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _number_kind(annotation: Any) -> str | None:
    """'a whole number' or 'a number' when a field's annotation (through ``| None`` and lists) takes numbers but not
    booleans, else None."""
    options = _members(annotation)
    if bool in options or Any in options:
        return None
    if float in options:
        return "a number"
    return "a whole number" if int in options else None


def _bounds(metadata: list[Any]) -> str:
    """The range a field's ``Field(ge=..., lt=...)`` gives, as text (" >= 0", " in (0, 1)")."""
    low = next((f"[{m.ge:g}" for m in metadata if hasattr(m, "ge")), None) or next(
        (f"({m.gt:g}" for m in metadata if hasattr(m, "gt")), None
    )
    high = next((f"{m.le:g}]" for m in metadata if hasattr(m, "le")), None) or next(
        (f"{m.lt:g})" for m in metadata if hasattr(m, "lt")), None
    )
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" {'>=' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f" {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
    return ""


class _Section(BaseModel):
    # nan and inf are refused in every float field: nothing in a scenario is meaningful at either
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 and false as 0 in a number field (``canaries = true`` would be one canary): a
        boolean is refused wherever a number is expected, in a list of numbers too."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, bool) for v in items):
            annotation = field.annotation
            # a list of numbers (data.domains): its items' kind
            lists = [a for a in (*typing.get_args(annotation), annotation) if typing.get_origin(a) is list]
            kind = next((k for a in lists if (k := _number_kind(typing.get_args(a)[0]))), None)
            listed = f"a list of {kind[2:]}s" if kind else None
            scalar = _number_kind(annotation)
            if isinstance(value, list):
                what = listed
            else:
                what = scalar and scalar + _bounds(field.metadata) + (f" or {listed}" if listed else "")
            if what is not None:
                raise ValueError(f"must be {what}, not true or false (a boolean is not read as 1 or 0)")
        return value


def _serialize_callable(value: Any, what: str) -> Any:
    """A callable given through the Python API, written as the reference that imports it back."""
    if value is None or isinstance(value, str):
        return value
    ref = factories.reference_of(value)
    if ref is None:
        raise ValueError(
            f"{what}={value!r} cannot be written to a scenario file: define it at module level in an importable "
            "module (it is then written as 'package.module:function')"
        )
    return ref


def _noise_multiplier(field: str, value: Any, zero_means: str | None) -> Any:
    """:func:`fedsim.validation.noise_multiplier_value`'s range, with the message the loader prefixes with the field."""
    if value is None:
        return None
    try:
        return noise_multiplier_value(field, value, zero_means)
    except PrivacyInputError as exc:
        raise ValueError(exc.allowed) from None


def _finite_values(what: str, value: Any) -> None:
    """Refuse nan and inf anywhere in a free-form value (a model option, a data function's options): a scenario is
    TOML, which cannot write them back, and no option is meaningful at either."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}={value!r}: nan and inf are not allowed; give a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_values(f"{what}.{k}", v)
    elif isinstance(value, list | tuple):
        for v in value:
            _finite_values(what, v)


class DataConfig(_Section):
    dataset: str | Callable[..., Any] = Field(
        "digits",
        description=f"one of {', '.join(DATASETS)}; 'hf:<repo id>' (flwr-datasets, needs the Hub or its cache); "
        "or a data function 'package.module:function' (see fedsim.data.user)",
    )
    options: dict[str, Any] | None = Field(None, description="data function: its keyword arguments")
    num_clients: int = Field(100, ge=2, description="clients in the population, held-out ones included")
    partitioner: Partitioner = Field(
        "dirichlet",
        description="how the training examples are split into clients: iid (uniformly), dirichlet (label skew set "
        "by alpha), pathological (classes_per_client labels each) or shard (shards_per_client label-sorted shards "
        "each)",
    )
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (smaller = more label skew)")
    classes_per_client: int = Field(2, ge=1, description="pathological partitioner: labels per client")
    shards_per_client: int = Field(2, ge=1, description="shard partitioner: shards per client")
    heldout_fraction: float = Field(0.1, ge=0, lt=1, description="clients never trained on (unseen clients)")
    domains: list[float] | int | None = Field(
        None, description="agnostic FL: number of equal domains, or the fraction of clients in each"
    )
    domain_shift: float | None = Field(
        None, ge=0, description="domains: feature shift of domain k (x feature std)"
    )
    domain_noise: float | None = Field(
        None, ge=0, description="domains: per-example feature noise growing with k"
    )
    domain_label_swaps: int | None = Field(
        None,
        ge=0,
        description="domains: pairs of classes whose labels are exchanged in every domain after the first",
    )
    num_samples: int | None = Field(None, ge=100, description="mnist1d: examples to generate")
    synthetic_alpha: float = Field(
        1.0,
        ge=0,
        description="synthetic: alpha of Synthetic(alpha, beta), how far the clients' models differ",
    )
    synthetic_beta: float = Field(
        1.0,
        ge=0,
        description="synthetic: beta of Synthetic(alpha, beta), how far the clients' features differ",
    )
    synthetic_iid: bool | None = Field(
        None, description="synthetic: one shared labelling model (Synthetic-IID)"
    )
    synthetic_min_samples: int | None = Field(None, ge=1, description="synthetic: fewest examples per client")
    synthetic_max_samples: int | None = Field(None, ge=1, description="synthetic: most examples per client")
    seq_len: int | None = Field(
        None, ge=1, description="shakespeare: characters per window (default 80, LEAF's)"
    )
    stride: int | None = Field(
        None, ge=1, description="shakespeare: characters between window starts (default 8; LEAF: 1)"
    )
    min_samples: int | None = Field(
        None, ge=1, description="shakespeare: fewest windows for a role to be a client (default 32)"
    )
    max_samples_per_client: int | None = Field(
        None,
        ge=1,
        description="shakespeare: most windows per client, evenly spaced over its text (default 256)",
    )
    targets: Literal["next", "sequence"] | None = Field(
        None,
        description="shakespeare: 'next' (default, LEAF's: the character after the window, labels [n]) or "
        "'sequence' (the next character at every position, targets [n, seq_len]; pair with a model that "
        "outputs [n, seq_len, classes], e.g. model.per_token = true)",
    )

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        if callable(value) or value in DATASETS or factories.is_reference(value):
            return value
        if isinstance(value, str) and value.startswith("hf:") and len(value) > 3:
            return value
        raise ValueError(
            f"allowed one of {', '.join(map(repr, DATASETS))}, 'hf:<repo id>' or a data function "
            "'package.module:function'"
        )

    @field_validator("options")
    @classmethod
    def _finite_options(cls, value: Any) -> Any:
        _finite_values("data.options", value or {})
        return value

    @model_validator(mode="after")
    def _shakespeare_options(self) -> DataConfig:
        if self.dataset != "shakespeare":
            for key in ("seq_len", "stride", "min_samples", "max_samples_per_client", "targets"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"data.{key} is an option of dataset 'shakespeare' only, and this dataset is "
                        f"{self.dataset!r}: remove it (--set data.{key}=none)"
                    )
        return self

    @model_validator(mode="after")
    def _options_for_functions(self) -> DataConfig:
        if self.options is not None and not (callable(self.dataset) or factories.is_reference(self.dataset)):
            raise ValueError(
                "data.options are the keyword arguments of a data function; this dataset takes none"
            )
        return self

    @field_serializer("dataset")
    def _dataset_out(self, value: Any) -> Any:
        return _serialize_callable(value, "data.dataset")


class ModelConfig(BaseModel):
    """The model: a shipped one by ``name`` or any factory ``f(input_shape, num_classes, **options)`` by
    ``factory``; every other key of the section is one of the factory's options (``hidden = [32]``)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: ModelName | None = Field(None, description=f"a shipped model: {', '.join(MODELS)} (default mlp)")
    factory: str | Callable[..., Any] | None = Field(
        None, description="'package.module:function' returning an nn.Module (instead of name)"
    )
    loss: str | Callable[..., Any] = Field(
        "cross_entropy",
        description="'cross_entropy' (labels [n] or sequence targets [n, *T], padding id -100 not scored) or "
        "'package.module:function' giving one loss per example",
    )
    metric: str | Callable[..., Any] | None = Field(
        None,
        description="'package.module:function' giving one value per example, reported on evaluation as "
        "heldout_metric (client-level mean)",
    )

    def reference(self) -> Any:
        """The factory: the user's reference or callable, or the shipped model's reference."""
        return self.factory if self.factory is not None else MODEL_FACTORIES[self.name or "mlp"]

    def options(self) -> dict[str, Any]:
        """The factory's options: the section's other keys (a key set to none counts as not given, so that
        ``--set model.hidden=none`` removes a scenario's option)."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.name is not None and self.factory is not None:
            raise ValueError("give model.name (a shipped model) or model.factory, not both")
        if isinstance(self.factory, str) and not factories.is_reference(self.factory):
            raise ValueError(f"model.factory={self.factory!r}: allowed 'package.module:function'")
        for key, value in self.options().items():
            _finite_values(f"model.{key}", value)
        # import what is named now, so that a typo fails at load time rather than on a worker
        factories.check_options(self.reference(), self.options())
        factories.resolve_loss(self.loss)
        factories.resolve_metric(self.metric)
        return self

    @field_serializer("factory")
    def _factory_out(self, value: Any) -> Any:
        return _serialize_callable(value, "model.factory")

    @field_serializer("loss")
    def _loss_out(self, value: Any) -> Any:
        return _serialize_callable(value, "model.loss")

    @field_serializer("metric")
    def _metric_out(self, value: Any) -> Any:
        return _serialize_callable(value, "model.metric")


class ClientConfig(_Section):
    local_epochs: int = Field(
        1, ge=1, description="passes over its own data a sampled client makes per round"
    )
    batch_size: int = Field(16, ge=1, description="examples per local SGD step")
    lr: float = Field(0.1, gt=0, le=FLOAT32_MAX, description="local SGD step size (float32 training)")
    optimizer: Literal["sgd", "momentum"] = Field(
        "sgd", description="the local optimizer: plain SGD, or SGD with heavy-ball momentum"
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="optimizer momentum: the momentum coefficient")


#: the type of an error about one key inside the section being validated (:func:`error_at`)
ERROR_AT_KEY = "value_error_at_key"


def error_at(key: str, value: Any, message: str) -> PydanticCustomError:
    """An error about ``key`` inside the model being validated, which pydantic can only place at the model itself
    (a mechanism's option is an extra key, a moved key is refused before the fields are read): its text names the
    key for a Python caller, and the loader shows it at ``<model>.<key>`` with ``value`` as the value received
    (``format_validation_error``), as it shows a field's own error."""
    return PydanticCustomError(
        ERROR_AT_KEY,
        "{text}",
        {"text": f"{key}={value!r}: {message}", "key": key, "value": value, "message": message},
    )


def _toml_literal(value: Any) -> str:
    """``value`` as TOML writes it (``"honaker"``, ``4``, ``[1.0, 0.5]``), for messages that show a table to write."""
    import tomli_w

    try:
        return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()
    except (TypeError, ValueError):  # not a TOML value (an object given through the Python API)
        return repr(value)


class MechanismConfig(BaseModel):
    """``privacy.mechanism``: the noise mechanism, a registered noise source (``fedsim.round.NOISE_SOURCES``) by
    ``name``, and its options, every other key of the table (``bands = 4`` for banded-mf): its class's fields
    (:func:`fedsim.round.mechanism_options.option_names`), checked by the class itself. A scenario may write the
    name alone, ``mechanism = "tree"``, when it sets no option; it is written back that way
    (:meth:`PrivacyConfig._mechanism_out`). Options are not fields here because they are whatever the registered
    class takes, a mechanism registered from outside fedsim included."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: Annotated[str, AfterValidator(_registered("mechanism", lambda: tuple(NOISE_SOURCES)))] = Field(
        "independent",
        description="a registered noise source; independent: independent Gaussian noise every round",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """``"tree"`` is ``{name = "tree"}``; a name that is not registered is refused here, at
        ``privacy.mechanism``, where the shorthand wrote it."""
        if isinstance(data, str):
            return {"name": _registered("mechanism", lambda: tuple(NOISE_SOURCES))(data)}
        if isinstance(data, dict | MechanismConfig):
            return data
        raise ValueError(
            f"must be a mechanism's name ({', '.join(NOISE_SOURCES)}) or a [privacy.mechanism] table with its "
            "name and options"
        )

    def options(self) -> dict[str, Any]:
        """The mechanism's options: the table's other keys (one set to none counts as not given, so that
        ``--set privacy.mechanism.bands=none`` removes a scenario's option)."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}

    @model_validator(mode="after")
    def _check(self) -> MechanismConfig:
        try:
            check_mechanism_options(self.name, self.options())
        except PrivacyInputError as exc:
            # the option the class names (an unknown key, a value it refuses); a field that joins two options
            # (blt's decays/output_scales) stays at the table, its text naming both
            raise error_at(str(exc.field), exc.value, exc.allowed) from None
        return self


class SecAggConfig(_Section):
    """``[privacy.secagg]``: secure aggregation (SecAgg+) of the clients' noised encodings
    (:class:`fedsim.privacy.settings.SecureAggregation`)."""

    enabled: bool = Field(
        False,
        description="the server learns only the sum of the clients' encodings modulo 2^bits (SecAgg+; needs "
        "noise_placement = 'distributed' and mechanism 'ddgauss' or 'skellam'); in simulation the same modular sum, "
        "dropouts and aborts, without the cryptography",
    )
    neighbours: int = Field(
        0,
        ge=0,
        description="k, even: each client shares its secrets with k others (SecAgg+); 0: all (SecAgg)",
    )
    threshold: float = Field(
        0.6,
        gt=0.5,
        le=1,
        description="fraction of a client's k+1 share holders needed to unmask it; fewer survivors abort the round",
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="simulation only: probability a client drops after sharing its keys"
    )

    def settings(self) -> SecureAggregation | None:
        """The run's :class:`SecureAggregation`, or None when not enabled."""
        if not self.enabled:
            return None
        return SecureAggregation(neighbours=self.neighbours, threshold=self.threshold, dropout=self.dropout)


class PrivacyConfig(_Section):
    sampling: Annotated[str, AfterValidator(_registered("sampling", sampling_names))] = Field(
        "poisson",
        description="a registered sampling scheme (fedsim.round.SAMPLERS): poisson, fixed, all, ...",
    )
    sampling_rate: float | None = Field(None, gt=0, le=1, description="poisson: inclusion probability q")
    clients_per_round: int | None = Field(
        None, ge=1, description="fixed: cohort size; poisson: expected cohort size (q = this / population)"
    )
    clip: float = Field(
        1.0, ge=0, description="L2 bound on one client's update; 0: no clipping (plain FedAvg)"
    )
    noise_multiplier: float = Field(
        1.0,
        ge=0,
        description="noise std on the sum = noise_multiplier * clip; 0: the non-private baseline (clipped, "
        "un-noised; epsilon is infinite); else in [{:g}, {:g}]".format(*NOISE_MULTIPLIER_RANGE),
    )
    noise_placement: NoisePlacement = Field(
        "central",
        description="who adds the noise: the server to the clipped sum (central), or each sampled client a share "
        "of it (distributed; the shares sum to the accounted noise over the expected cohort)",
    )
    target_epsilon: float | None = Field(
        None,
        gt=0,
        description="calibrate noise_multiplier before the run so that the certified epsilon after `rounds` rounds "
        "is this (for the run's sampling, schedule and mechanism; the value found is written to the config)",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta epsilon is certified at")
    accountant: Annotated[str, AfterValidator(_registered("accountant", certified_methods))] = Field(
        DEFAULT_ACCOUNTANT,
        description="a certified accountant of the registry (fedsim.privacy.ACCOUNTANTS): pld, rdp, ...",
    )
    mechanism: MechanismConfig | None = Field(
        None,
        description="the noise mechanism: a registered noise source's name (fedsim.round.NOISE_SOURCES), or a "
        "[privacy.mechanism] table with its name and options (name = 'banded-mf', bands = 4); default "
        "independent: independent Gaussian noise every round",
    )
    min_separation: int | None = Field(
        None,
        ge=1,
        description="a participation schedule's b: cyclic, the number of groups taking turns; min-separation, the "
        "least number of rounds between one client's rounds",
    )
    max_participations: int | None = Field(
        None, ge=1, description="min-separation: the most rounds one client takes part in (default: no cap)"
    )
    randomness: Randomness = Field(
        "seeded",
        description="where the cohort and the noise come from: 'seeded' (from seed: reproducible simulation) or "
        "'os-entropy' (the operating system; what a deployment always uses)",
    )
    max_epsilon: float | None = Field(None, gt=0, description="stop before a round that would exceed it")
    canaries: int = Field(
        0,
        ge=0,
        description="simulation only: 2k canary directions, each inserted as a canary client with probability 1/2 "
        "(sampled, clipped, noised and accounted like every client); the rows then give Andrew et al.'s "
        "epsilon estimate and Steinke et al.'s one-run lower bound (empirical, not certificates); 0: none",
    )
    canary_confidence: float = Field(
        0.95, gt=0, lt=1, description="canaries: the confidence of the one-run lower bound on epsilon"
    )
    secagg: SecAggConfig = Field(
        default_factory=SecAggConfig,
        description="secure aggregation of the clients' noised encodings ([privacy.secagg]; default: off)",
    )
    adaptive_clip: bool = Field(
        False,
        description="adaptive clipping (Andrew et al. 2021): the clip follows a quantile of the update norms, "
        "estimated each round from a noised count of the unclipped updates (a release epsilon covers)",
    )
    target_quantile: float = Field(
        0.5, gt=0, lt=1, description="adaptive clipping: the fraction of updates left unclipped it aims for"
    )
    clip_lr: float = Field(0.2, gt=0, description="adaptive clipping: geometric step size eta_C")
    count_noise_multiplier: float | None = Field(
        None,
        gt=0,
        description="adaptive clipping: noise std of the clipped-count release (default: clients/20), in "
        "[{:g}, {:g}]".format(*NOISE_MULTIPLIER_RANGE),
    )

    #: not settings: the precedence rules the loader applied when it merged this section's layers
    #: (scenarios.loader.noise_precedence), and whether noise_multiplier holds the value calibrated to
    #: target_epsilon (set by fedsim.experiment.build_experiment)
    _rules: list[str] = PrivateAttr(default_factory=list)
    _calibrated: bool = PrivateAttr(default=False)

    @property
    def rules(self) -> list[str]:
        """The precedence rules applied when the scenario's layers were merged (empty when none was needed)."""
        return list(self._rules)

    @rules.setter
    def rules(self, value: list[str]) -> None:
        self._rules = list(value)

    @property
    def calibrated(self) -> bool:
        """Whether ``noise_multiplier`` is the value calibrated to ``target_epsilon`` (after the run's build)."""
        return self._calibrated and self.target_epsilon is not None

    def mark_calibrated(self, noise_multiplier: float) -> None:
        """Set ``noise_multiplier`` to the value calibrated to ``target_epsilon``, and say so."""
        self.noise_multiplier = noise_multiplier
        self._calibrated = True

    def calibration_text(self, rounds: int) -> str | None:
        """``"calibrated to target epsilon 4 over 20 rounds (delta 1e-05, pld)"``, or None when not calibrated."""
        if not self.calibrated:
            return None
        return (
            f"calibrated to target epsilon {self.target_epsilon:g} over {rounds} rounds "
            f"(delta {self.delta:g}, {self.accountant})"
        )

    def provenance(self, rounds: int | None = None) -> list[str]:
        """Where the noise multiplier came from, as lines for ``config.toml``'s comments: its calibration (when
        ``rounds`` is given and it was calibrated) and the precedence rules applied."""
        calibration = self.calibration_text(rounds) if rounds is not None else None
        head = (
            [f"privacy.noise_multiplier = {self.noise_multiplier!r} is {calibration}"] if calibration else []
        )
        return [*head, *(f"settings rule: {r}" for r in self._rules)]

    @field_validator("noise_multiplier", "count_noise_multiplier")
    @classmethod
    def _noise_range(cls, value: Any, info: ValidationInfo) -> Any:
        # fedsim.validation's one range for every noise multiplier (0: no noise, for the model release only)
        return _noise_multiplier(
            info.field_name, value, NO_NOISE if info.field_name == "noise_multiplier" else None
        )

    @property
    def mechanism_name(self) -> str:
        """The noise mechanism's registered name (``privacy.mechanism`` absent: independent)."""
        return self.mechanism.name if self.mechanism is not None else "independent"

    def mechanism_options(self) -> dict[str, Any]:
        """The noise mechanism's options (``privacy.mechanism.bands``, ...), checked by its class; {} for none."""
        return self.mechanism.options() if self.mechanism is not None else {}

    @field_serializer("mechanism")
    def _mechanism_out(self, value: MechanismConfig | None) -> str | dict[str, Any] | None:
        """Written back as it is read: the name alone without options, else the table (so ``config.toml``
        loads to the same scenario, and a run without options reads as before the table existed)."""
        if value is None:
            return None
        options = value.options()
        return {"name": value.name, **options} if options else value.name

    @model_validator(mode="before")
    @classmethod
    def _moved_options(cls, data: Any) -> Any:
        """A mechanism's options were keys of this section (``privacy.bands``) until they became the mechanism's
        own table: refused with the key they have now, and the table to write (one set to none asks for its
        absence, which holds: it is dropped)."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in MOVED_OPTIONS and v is None)}
        for key in MOVED_OPTIONS:
            if key not in data:
                continue
            value, given = data[key], data.get("mechanism")
            name = given.get("name") if isinstance(given, dict) else given
            if not (isinstance(name, str) and name in NOISE_SOURCES and key in option_names(name)):
                # the mechanism named does not take it: name one that does
                name = next((n for n in NOISE_SOURCES if key in option_names(n)), str(name))
            raise error_at(
                key,
                value,
                f"moved: set it as privacy.mechanism.{key}, a [privacy.mechanism] table with name = "
                f"{_toml_literal(name)} and {key} = {_toml_literal(value)} (on the command line: --set "
                f"privacy.mechanism={name} --set privacy.mechanism.{key}="
                f"{value if isinstance(value, str) else _toml_literal(value)})",
            )
        return data

    def settings(self, *, agnostic: bool = False) -> PrivacySettings:
        """This section as the run's one :class:`fedsim.privacy.PrivacySettings` (``agnostic``: the run also releases
        agnostic FL's losses), validated by the rules every caller asks (:mod:`fedsim.privacy.settings`)."""
        adaptive = (
            AdaptiveClipping(self.target_quantile, self.clip_lr, self.count_noise_multiplier)
            if self.adaptive_clip
            else None
        )
        return PrivacySettings(
            sampling=self.sampling,
            sampling_rate=self.sampling_rate,
            clients_per_round=self.clients_per_round,
            clip=self.clip,
            noise_multiplier=self.noise_multiplier,
            noise_placement=self.noise_placement,
            mechanism=self.mechanism_name,
            mechanism_options=self.mechanism_options(),
            min_separation=self.min_separation,
            max_participations=self.max_participations,
            adaptive_clipping=adaptive,
            delta=self.delta,
            accountant=self.accountant,
            max_epsilon=self.max_epsilon,
            target_epsilon=self.target_epsilon,
            canaries=self.canaries,
            agnostic=agnostic,
            secagg=self.secagg.settings(),
        )

    @model_validator(mode="after")
    def _cohort(self) -> PrivacyConfig:
        # the sampling scheme's own rule (Sampler.check_cohort), so a scenario and the API refuse the same values
        check_cohort(self.sampling, self.sampling_rate, self.clients_per_round)
        self.settings()  # the one set of combination rules (the Scenario asks again with agnostic FL)
        return self


class ServerConfig(_Section):
    optimizer: ServerOptimizerName = Field(
        "sgd",
        description="applied to the released (noised) mean update: sgd (FedAvg at lr 1), momentum (FedAvgM) or "
        "adam (FedAdam)",
    )
    lr: float = Field(1.0, gt=0, description="server step size")
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum, adam: the first-moment coefficient")
    beta2: float = Field(0.99, gt=0, lt=1, description="adam: the second-moment coefficient")
    eps: float = Field(1e-3, gt=0, description="adam: denominator term (FedAdam's tau)")


class AgnosticConfig(_Section):
    enabled: bool = Field(
        False,
        description="agnostic FL (Mohri et al. 2019): train for the worst mixture of data.domains, whose mixture "
        "weights (lambda) follow the noised per-domain losses",
    )
    lambda_lr: float = Field(0.1, gt=0, description="projected gradient ascent step on the mixture weights")
    loss_noise_multiplier: float = Field(
        1.0,
        gt=0,
        description="noise on the per-domain loss sums, in [{:g}, {:g}]".format(*NOISE_MULTIPLIER_RANGE),
    )

    @field_validator("loss_noise_multiplier")
    @classmethod
    def _noise_range(cls, value: Any) -> Any:
        return _noise_multiplier("loss_noise_multiplier", value, None)


class EngineConfig(_Section):
    name: Annotated[str, AfterValidator(_registered("engine.name", engine_names, docs="engine"))] = Field(
        "auto",
        description="a registered engine (fedsim.registry.ENGINES): auto (local or ray, picked by the run's needs, "
        "the machine's CPUs and a round's size; summary.json says which and why), ray, local, flower, ...",
    )
    num_workers: int = Field(2, ge=1, description="engine ray: the Ray workers that train the cohort")
    num_cpus_per_worker: float = Field(
        1.0, gt=0, description="CPUs Ray reserves for each worker (engine flower: for each virtual client)"
    )
    num_gpus_per_worker: float = Field(
        0.0, ge=0, description="GPUs Ray reserves for each worker (a fraction shares one); > 0 needs Ray"
    )
    ray_address: str | None = Field(
        None,
        description="connect to an existing Ray cluster: 'auto' or its GCS address 'host:6379', from a node of "
        "the cluster (Ray Client 'ray://' addresses are refused: they cannot stream partial sums)",
    )
    vectorize: Vectorize | bool = Field(
        "auto",
        description="how a worker trains its clients: 'auto' (per-layer rules, else torch.func.vmap, else the "
        "loop), or one of 'per-layer', 'vmap', 'loop'; true means 'auto', false 'loop'",
    )
    torch_threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="torch's CPU threads where the cohort trains (engines local and ray): 'auto' (the per-client "
        "loop 1; the vectorised paths one per CPU of a Ray worker, or the usable CPUs less one in process; "
        "fedsim.engine.threads), or a whole number for every path; the in-process engine gives the caller's count "
        "back when the run ends; summary.json's engine says the count used",
    )
    eval_every: int = Field(1, ge=1, description="evaluate train and held-out clients every N rounds")
    eval_clients: int | None = Field(
        None,
        ge=1,
        description="evaluate at most this many training clients and this many held-out clients: a fixed sample "
        "drawn once from the seed, the same in every evaluated round, so evaluation does not grow with the "
        "population (rows then give heldout_clients_evaluated and non_private.train_clients_evaluated); "
        "none: every client",
    )
    checkpoint_every: int = Field(
        10,
        ge=0,
        description="write checkpoint.npz every N rounds (fedsim run --resume continues from it); 0: never",
    )
    round_timeout_s: float | None = Field(
        None,
        gt=0,
        description="a client not finished this many seconds after its round began counts as failed (a zero "
        "update; noise and accounting unchanged); its Ray worker is replaced. Engines 'ray' and 'flower'",
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="stop the run (exit code 4, nothing of that round released) when more than this fraction of "
        "a round's sampled clients failed; 1: never stop",
    )

    @field_validator("torch_threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        """One message for every wrong value (the union would give one per member)."""
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024):
            return value
        raise ValueError("allowed 'auto' or a whole number of threads in [1, 1024]")

    @field_validator("ray_address")
    @classmethod
    def _no_ray_client(cls, value: str | None) -> str | None:
        if value is not None and value.strip().lower().startswith("ray://"):
            raise ValueError(
                f"{value!r} is a Ray Client address, which cannot run the workers' streaming methods (each worker "
                "streams a partial sum per unit of work, so a lost worker loses only what it had not sent); run "
                "fedsim on a node of the cluster with ray_address = 'auto' or the GCS address 'host:6379'"
            )
        return value

    @model_validator(mode="after")
    def _timeout_needs_another_process(self) -> EngineConfig:
        # the engine declares whether it can stop a hung client ('auto' then picks one that can)
        if self.round_timeout_s is not None and not engine_entry(self.name).supports_round_timeout:
            raise ValueError(
                f"engine.round_timeout_s needs engine.name 'ray' or 'flower': the {self.name!r} engine trains in "
                "this process and cannot stop a client that hangs"
            )
        return self


class ReportConfig(_Section):
    membership_attack: bool = Field(
        False,
        description="each evaluated round, a client-level loss-threshold membership-inference attack (members: "
        "training clients, non-members: held-out clients, balanced); a non-private diagnostic",
    )
    tensorboard: bool = Field(
        False,
        description="also write the rows' scalars (one step per round) and the config as TensorBoard event files "
        "in <run directory>/tensorboard; needs the tensorboard package",
    )
    mlflow: str | None = Field(
        None,
        description="also log the rows' scalars (one step per round), the config (params) and the privacy status "
        "(tags) to MLflow at this tracking URI: a local file store as 'file:///abs/mlruns' or a folder path "
        "('./mlruns', relative to the working directory, or '/abs/mlruns'), or any URI MLflow takes "
        "('sqlite:///mlflow.db', 'http://host:5000'); needs mlflow or mlflow-skinny; '' is off",
    )

    @field_validator("mlflow")
    @classmethod
    def _tracking_uri(cls, value: str | None) -> str | None:
        if value is None or not value.strip():  # TOML has no null: an empty string turns it off
            return None
        from fedsim.tracking_uri import check_tracking_uri  # its form only; nothing is imported or opened

        return check_tracking_uri(value)


class SweepConfig(_Section):
    """What ``fedsim sweep NAME`` compares when no ``--grid`` is given (``--grid`` and ``--seeds`` override)."""

    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="dotted key -> values; every combination is one run"
    )
    variants: list[dict[str, Any]] = Field(
        default_factory=list,
        description="sets of linked values (dotted key -> value, 'label' names the set), each crossed with the grid",
    )
    seeds: int = Field(
        1,
        ge=1,
        le=1000,
        description="runs per setting, seeds seed, seed+1, ...: each run's data_seed and noise_seed, but one the "
        "scenario fixes (then the seeds vary the other alone)",
    )
    reference: str | None = Field(
        None,
        description="the setting every other is compared with, paired by seed, as key=value[,key=value] (e.g. "
        "'variant=dp-fedavg' or 'privacy.noise_multiplier=0'); default: the first setting; `--reference` overrides",
    )
    line: str | None = Field(
        None,
        description="the grid key drawn as one line per value in the privacy-utility plot ('variant' too)",
    )
    last: int = Field(
        5,
        ge=1,
        le=10_000,
        description="held-out accuracy is compared as its mean over each run's last `last` evaluated rounds "
        "(the final round alone swings at high noise); `--last` overrides",
    )


#: what each of a scenario's two seeds draws; ``seed`` is the shorthand for both (each defaults to it). A sweep's
#: ``seeds = k`` varies ``seed`` (so both) unless the scenario fixes one, which then stays fixed: with data_seed
#: fixed, the seeds differ in the privacy mechanism's randomness alone. Differences paired by seed compare settings
#: on the same data, initial model and batch orders (fedsim.report.sweep_table.paired_differences).
SEEDS = {
    "data_seed": "the data and the training: a generated dataset (synthetic, domains' shifts, noise and label swaps), "
    "a data function's seed argument, the partition, the held-out clients, the model's initialisation, each "
    "client's batch order and dropout masks, the evaluation sample (engine.eval_clients) and the membership "
    "attack's sample",
    "noise_seed": "the privacy mechanism (with privacy.randomness = 'seeded'; 'os-entropy' draws it from the "
    "operating system): each round's cohort (and a cyclic schedule's groups), the noise of every mechanism "
    "(distributed noise shares, adaptive clipping's count noise, agnostic FL's loss noise) and the canaries' "
    "directions and coins",
}


class Scenario(_Section):
    """One experiment, validated: what :func:`fedsim.load_scenario` returns (a TOML file with ``--set`` items
    applied) and :func:`fedsim.run` runs. Built in Python, its model, loss and data may be callables defined at
    module level in an importable module. Every key, with its type, default and allowed values, is on the
    scenario keys reference page (``docs/reference/scenario-keys.md``), generated from this schema."""

    name: str = Field("unnamed", description="the scenario's name: it names the run directory and the plots")
    description: str = Field(
        "", description="what the scenario runs or compares (`fedsim scenarios` lists it)"
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="modules imported before the rest of the scenario is validated, in every process that loads it "
        "(fedsim run, Ray workers, ClientApps, the ServerApp): they register samplers, noise mechanisms, release "
        "kinds, accountants, layer rules or engines written outside fedsim, so their names are valid here. Each must "
        "be installed, or on PYTHONPATH, wherever the scenario runs",
    )
    seed: int = Field(0, ge=0, description="the shorthand for data_seed and noise_seed: each defaults to it")
    data_seed: int | None = Field(None, ge=0, description=f"draws {SEEDS['data_seed']} (default: seed)")
    noise_seed: int | None = Field(None, ge=0, description=f"draws {SEEDS['noise_seed']} (default: seed)")
    rounds: int = Field(
        30, ge=1, description="rounds T: each samples a cohort, trains it and releases one update"
    )
    data: DataConfig = Field(
        default_factory=DataConfig,
        description="the dataset, its partition into clients, the held-out clients",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="the model: a shipped one or a factory, its options, loss, metric",
    )
    client: ClientConfig = Field(
        default_factory=ClientConfig, description="local training on a sampled client"
    )
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig,
        description="client-level differential privacy: sampling, clipping, noise, accounting, budget",
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="the server optimizer that applies the released mean update"
    )
    agnostic: AgnosticConfig = Field(
        default_factory=AgnosticConfig,
        description="agnostic federated learning over data.domains (default: off)",
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="where and how the cohort trains and is evaluated: engine, workers, threads, checkpoints",
    )
    report: ReportConfig = Field(
        default_factory=ReportConfig, description="diagnostics and trackers beside the run directory"
    )
    sweep: SweepConfig = Field(
        default_factory=SweepConfig, description="what `fedsim sweep NAME` compares when no --grid is given"
    )

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        """Import ``plugins`` first: the registries they add to decide which names the sections accept."""
        modules = data.get("plugins") if isinstance(data, dict) else None
        if not modules:
            return data
        if not isinstance(modules, list | tuple) or not all(isinstance(m, str) and m for m in modules):
            raise ValueError(
                f"plugins must be a list of module names, e.g. ['mypackage.mechanisms']; got {modules!r}"
            )
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # not found, a relative name, or the plugin's own import failing
                raise ValueError(
                    f"plugins: cannot import {module!r} ({type(exc).__name__}: {exc}); it must be an importable "
                    "module, installed or on PYTHONPATH, in every process that loads the scenario (Ray workers and "
                    "ClientApps too)"
                ) from None
        return data

    @model_validator(mode="after")
    def _resolve_seeds(self) -> Scenario:
        """``data_seed`` and ``noise_seed`` not given (or given as none) are ``seed``, resolved here so that
        ``config.toml`` records the values the run used; again whenever ``seed`` is assigned (validate_assignment).
        A ``seed`` given beside both, equal to neither, would draw nothing: refused, as a label that does not
        describe the run."""
        for key in SEEDS:
            if getattr(self, key) is None:
                self.model_fields_set.discard(key)  # given as none: follows seed, as if not given
            if key not in self.model_fields_set:
                self.__dict__[key] = self.seed
        given = {k: getattr(self, k) for k in SEEDS if k in self.model_fields_set}
        if "seed" in self.model_fields_set and len(given) == len(SEEDS) and self.seed not in given.values():
            raise ValueError(
                f"seed={self.seed} is the shorthand for data_seed and noise_seed, and both are given "
                f"({', '.join(f'{k}={v}' for k, v in given.items())}), so it would label a run it does not draw: "
                f"give seed equal to one of them (--set seed={self.data_seed}, the data's)"
            )
        return self

    @model_validator(mode="after")
    def _agnostic_schedule(self) -> Scenario:
        if self.agnostic.enabled and self.privacy.target_epsilon is not None:
            raise PrivacyInputError(
                "privacy.target_epsilon",
                self.privacy.target_epsilon,
                "is calibrated for the model update alone; agnostic FL's loss releases add to epsilon",
            )
        if self.agnostic.enabled:  # the rules again, now that the run releases the domains' losses too
            self.privacy.settings(agnostic=True)
        p, a = self.privacy, self.agnostic
        composed_noise_multiplier(
            {
                "privacy.noise_multiplier": p.noise_multiplier,
                "privacy.count_noise_multiplier": p.count_noise_multiplier if p.adaptive_clip else None,
                "agnostic.loss_noise_multiplier": a.loss_noise_multiplier if a.enabled else None,
            }
        )
        self._canaries_allowed()
        return self

    @model_validator(mode="after")
    def _bands_within_rounds(self) -> Scenario:
        """banded-mf's strategy for a run of T rounds is a T x T lower-triangular Toeplitz matrix: it has at most T
        bands (T bands is the full matrix), so the mechanism would run a larger ``privacy.mechanism.bands`` as T
        bands while config.toml said otherwise. Refused, naming both."""
        bands, rounds = self.privacy.mechanism_options().get("bands"), self.rounds
        if bands is not None and bands > rounds:
            raise PrivacyInputError(
                "privacy.mechanism.bands",
                bands,
                f"must be <= rounds={rounds}: banded-mf's strategy for {rounds} rounds is a {rounds} x {rounds} "
                f"lower-triangular matrix, which has at most {rounds} bands (bands = rounds is the full matrix); "
                f"allowed: 1 to {rounds}, or more rounds",
            )
        return self

    def _canaries_allowed(self) -> None:
        """Canaries are inserted by fedsim's own engines: the engine declares whether it does
        (:attr:`fedsim.registry.EngineEntry.supports_canaries`). Every privacy rule about canaries is
        :mod:`fedsim.privacy.settings`'s, asked when the privacy section was validated."""
        p = self.privacy
        if p.canaries and not engine_entry(self.engine.name).supports_canaries:
            raise canaries_refused(
                p.canaries,
                f"engine.name={self.engine.name!r} (canaries are inserted by fedsim's own engines: 'auto', "
                "'local' or 'ray')",
            )


# --------------------------------------------------------------------------------------------- the keys, listed


@dataclasses.dataclass(frozen=True)
class ScenarioKey:
    """One key of a scenario as the reference page lists it (docs/reference/scenario-keys.md is generated from
    :func:`scenario_keys`, so the page is the schema): every cell is text read off the field itself."""

    #: the dotted path a scenario file's tables and ``--set`` write (``privacy.secagg.threshold``)
    key: str
    #: what the value is (``a number``, ``a whole number or 'auto'``, ``a table``)
    type: str
    #: the default as TOML writes it; ``""`` where there is none (not set, or a table)
    default: str
    #: the values accepted beyond the type: Literal choices, a registry's names, the Field's range; ``""``: any
    allowed: str
    #: the field's ``description``
    meaning: str
    #: a table of keys (``[privacy.secagg]``), listed before its keys
    table: bool = False


#: how a type reads in the reference (a Literal's choices go to ``allowed``; None is "not set", shown as no default)
_TYPE_WORDS: dict[Any, str] = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "text",
    Any: "any value",
}


def _type_text(annotation: Any) -> str:
    """``annotation`` in words: its union's members joined with "or" (None left out: it is "not set")."""
    words: list[str] = []
    for member in _members(annotation):
        if member is type(None):
            continue
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is Annotated:
            text = _type_text(args[0])
        elif origin is Literal:
            text = _TYPE_WORDS[type(args[0])] if args and type(args[0]) in _TYPE_WORDS else "a value"
        elif origin in (list, tuple):  # a tuple[float, ...] is a TOML list too
            text = f"a list of ({_type_text(args[0])})" if args else "a list"
        elif origin is dict or (isinstance(member, type) and issubclass(member, BaseModel)):
            text = "a table"
        elif origin is Callable or member is Callable:  # typing.Callable[..., Any] and the bare one
            text = "a Python callable (API only)"
        else:
            text = _TYPE_WORDS.get(member, getattr(member, "__name__", str(member)))
        if text not in words:
            words.append(text)
    return " or ".join(words)


def _allowed_text(field: Any) -> str:
    """The values ``field`` accepts beyond its type: a Literal's choices, a registry's names as registered now
    (:func:`_registered`), and the range its ``Field(ge=..., lt=...)`` gives, in :func:`_bounds`'s words (the
    same text a boolean given for a number is refused with)."""
    parts: list[str] = []
    for member in _members(field.annotation):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is Literal:
            parts.append("one of " + ", ".join(f"`{a}`" for a in args))
        elif origin is Annotated:
            bounds = _bounds([m for info in args[1:] for m in getattr(info, "metadata", [info])]).strip()
            if bounds:
                parts.append(f"{_type_text(args[0])} {bounds}")
    for validator in field.metadata:
        names = getattr(getattr(validator, "func", None), "names", None)
        if names is not None:
            parts.append("a registered name: " + ", ".join(f"`{n}`" for n in names()))
    bounds = _bounds(field.metadata).strip()
    if bounds:
        parts.append(bounds)
    return "; or ".join(parts)


def _default_text(field: Any) -> str:
    """The default of a value (not a table) as TOML writes it; ``""`` for none (not set)."""
    if field.is_required():
        return ""
    value = field.get_default(call_default_factory=True)
    if value is None:
        return ""
    if isinstance(value, dict | list) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    return _toml_literal(value)


def _description(key: str, field: Any) -> str:
    """A field's meaning; a field without one is refused, so the reference cannot list a key it does not explain
    (the documentation build fails, naming the key)."""
    if not (field.description or "").strip():
        raise ValueError(
            f"scenario key {key!r} has no description: give its Field a description= in scenarios/schema.py "
            "(docs/reference/scenario-keys.md lists every key with its meaning)"
        )
    return " ".join(field.description.split())


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds a table of (``MechanismConfig`` for ``MechanismConfig | None``), else None."""
    return next((m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)), None)


def _mechanism_option_keys(prefix: str) -> list[ScenarioKey]:
    """``privacy.mechanism``'s options: each registered mechanism's (:func:`option_names`), read off its class's
    dataclass fields (type and default). The meaning is the field's ``metadata["description"]`` where the class
    gives one, else the class, whose docstring explains its options. An option several mechanisms take is one row
    naming each (and each default, where they differ)."""
    takers: dict[str, list[tuple[str, type, dataclasses.Field]]] = {}
    for name, cls in NOISE_SOURCES.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for option in option_names(name):
            takers.setdefault(option, []).append((name, cls, fields[option]))
    rows = []
    for option, mechanisms in takers.items():
        defaults = {
            name: "" if f.default in (None, dataclasses.MISSING) else _toml_literal(f.default)
            for name, _, f in mechanisms
        }
        if len(set(defaults.values())) > 1:
            default = ", ".join(f"{d or 'not set'} (`{n}`)" for n, d in defaults.items())
        else:
            default = next(iter(defaults.values()))
        said = [f.metadata.get("description") for _, _, f in mechanisms if f.metadata.get("description")]
        classes = ", ".join(f"{c.__module__}.{c.__qualname__}" for _, c, _ in mechanisms)
        meaning = (
            said[0] if said else f"an option of the mechanism's class ({classes}: its docstring says what)"
        )
        name, cls, _ = mechanisms[0]
        rows.append(
            ScenarioKey(
                f"{prefix}.{option}",
                _type_text(typing.get_type_hints(cls)[option]),
                default,
                "with mechanism " + " or ".join(f"`{n}`" for n, _, _ in mechanisms),
                " ".join(meaning.split()),
            )
        )
    return rows


def scenario_keys(model: type[BaseModel] = Scenario, prefix: str = "") -> list[ScenarioKey]:
    """Every key a scenario may set, depth first in the schema's order: each table (``[privacy]``) before its keys,
    nested tables (``privacy.secagg``, ``privacy.mechanism``) within it, the keys a table takes beyond its fields
    (a model's options, a mechanism's) after them. Raises ValueError for a field without a description.

    The text comes from the fields themselves (annotation, default, ``Field`` range, description) and the
    registries as they stand, so a registered plug-in's names are listed where its module was imported first."""
    rows: list[ScenarioKey] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        meaning = _description(key, field)
        section = _section(field.annotation)
        if section is not None:
            shorthand = _type_text(field.annotation).replace("a table", "").strip(" or")
            kind = "a table" + (f" or {shorthand}" if shorthand else "")
            rows.append(ScenarioKey(key, kind, "", _allowed_text(field), meaning, table=True))
            rows.extend(scenario_keys(section, f"{key}."))
            if section is MechanismConfig:
                rows.extend(_mechanism_option_keys(key))
            elif section.model_config.get("extra") == "allow":
                doc = " ".join((section.__doc__ or "").split())
                rows.append(ScenarioKey(f"{key}.<option>", "any value", "", "", doc))
            continue
        rows.append(
            ScenarioKey(
                key, _type_text(field.annotation), _default_text(field), _allowed_text(field), meaning
            )
        )
    return rows
