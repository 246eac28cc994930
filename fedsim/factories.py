"""The user's model, loss and data functions: named as ``"package.module:function"`` or given as callables.

This is the contract between a scenario and the code that trains it. Nothing here (nor in the training code
that uses it) knows a model's class or its parameter names:

* a **model factory** is ``f(input_shape, num_classes, **options) -> nn.Module``; ``input_shape`` is the shape
  of one example (``(40,)`` for MNIST-1D, ``(1, 8, 8)`` for the digits as images);
* a **loss** is ``loss(outputs, targets) -> per-example losses [n]``; fedsim averages them over a batch (and
  masks padded examples when clients train together). ``"cross_entropy"`` is the default: for labels ``[n]`` and
  logits ``[n, classes]``, and for sequence targets ``[n, *T]`` and logits ``[n, *T, classes]``, where an
  example's loss is its mean over the target tokens whose id is not :data:`IGNORE_INDEX` (padding);
* a **metric** is ``metric(outputs, targets) -> per-example values [n]``, reported on evaluation (mean per
  client, then over clients, like the loss); optional;
* a **data function** is described in :mod:`fedsim.data.user`.

A reference is resolved with :func:`import_object` on whichever process needs it (the driver, a Ray worker, a
Flower ClientApp), so the module must be importable there: installed, or on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.labels import see_docs

#: ``package.module:attribute`` (the attribute may be dotted: ``module:Class.method``)
REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

Factory = str | Callable[..., nn.Module]
Loss = str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a ``"package.module:function"`` string."""
    return isinstance(value, str) and REFERENCE.match(value) is not None


def import_object(reference: str, what: str) -> Any:
    """The object ``"package.module:attribute"`` names; a ``ValueError`` that says what is wrong otherwise."""
    if not is_reference(reference):
        raise ValueError(f"invalid {what}={reference!r}: allowed 'package.module:function'")
    module_name, attr = reference.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"invalid {what}={reference!r}: module {module_name!r} cannot be imported ({exc}); it must be "
            f"installed or on PYTHONPATH in every process that trains ({see_docs('own-model')})"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"invalid {what}={reference!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ValueError(f"invalid {what}={reference!r}: {type(obj).__name__} is not callable")
    return obj


def reference_of(obj: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` of a module-level callable that imports back to the same object, else ``None``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        return None
    ref = f"{module}:{qualname}"
    try:
        return ref if import_object(ref, "factory") is obj else None
    except ValueError:
        return None


def describe(spec: Any) -> str:
    """A reference string for the run's records, whether ``spec`` was given as a string or a callable."""
    if isinstance(spec, str):
        return spec
    return reference_of(spec) or f"<callable {getattr(spec, '__qualname__', type(spec).__name__)}>"


def resolve(spec: Any, what: str) -> Callable[..., Any]:
    """A callable from a reference string or the callable itself."""
    if callable(spec) and not isinstance(spec, str):
        return spec
    return import_object(spec, what)


# --------------------------------------------------------------------------- models
def positive_ints(option: str, value: Any, *, allow_empty: bool = False) -> tuple[int, ...]:
    """``value`` (an int ``d`` or a sequence of ints) as a tuple of positive ints; a ``ValueError`` naming
    ``option`` otherwise. Input shapes and the shipped models' widths are checked by it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value,)
    ok = isinstance(value, Sequence) and not isinstance(value, str) and (allow_empty or len(value) > 0)
    ok = ok and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in value)
    if not ok:
        raise ValueError(f"invalid {option}={value!r}: allowed a list of positive integers")
    return tuple(int(v) for v in value)


def factory_options(factory: Callable[..., Any]) -> tuple[list[str], bool]:
    """The keyword options a factory takes besides ``input_shape`` and ``num_classes``, and whether it
    takes any (``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: accept what the user passes
        return [], True
    names = [
        n
        for n, p in list(params.items())[2:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_options(factory: Factory, options: dict[str, Any]) -> None:
    """Refuse an option the factory does not take (unless it takes ``**kwargs``), naming what it takes, and an
    option whose value does not fit the factory's type annotation for it (where it has one)."""
    fn = resolve(factory, "model.factory")
    accepted, any_key = factory_options(fn)
    for key, value in options.items():
        if not any_key and key not in accepted:
            import difflib

            near = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
            raise ValueError(
                f"invalid model.{key}={value!r}: the model factory {describe(factory)!r} takes "
                + (", ".join(accepted) if accepted else "no options")
                + (f" (did you mean model.{near[0]}?)" if near else "")
            )
    check_annotated(fn, options, "model")


def check_annotated(fn: Callable[..., Any], options: dict[str, Any], prefix: str) -> None:
    """Each of ``options`` must fit ``fn``'s type annotation for it, where it has one (pydantic's lax rules: no list
    for an int); the error names ``<prefix>.<option>``, the value and the annotation."""
    hints = _annotations(fn)
    for key, value in options.items():
        if key in hints:
            _check_type(f"{prefix}.{key}", value, hints[key])


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """The factory's resolved type annotations; none when they cannot be resolved (then nothing is checked)."""
    import typing

    try:
        return typing.get_type_hints(fn)
    except Exception:  # a forward reference that does not resolve, a C callable: check nothing
        return {}


def _check_type(option: str, value: Any, annotation: Any) -> None:
    """``value`` must fit ``annotation`` (pydantic's lax rules: an int for a float, a list for a tuple; not a list
    for an int)."""
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(annotation)
    except Exception:  # an annotation pydantic cannot check (a torch type, say): leave it to the factory
        return
    try:
        # lax: TOML has no tuples or paths, so a list where a tuple is annotated and a string for a Path must pass
        adapter.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        raise ValueError(
            f"invalid {option}={value!r}: the function's annotation is {_type_name(annotation)} ({first})"
        ) from None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def build_model(
    factory: Factory, input_shape: Any, num_classes: int, options: dict[str, Any] | None = None
) -> nn.Module:
    """Call the model factory and check what it returns (an ``nn.Module`` fedsim can train privately)."""
    fn = resolve(factory, "model.factory")
    shape = positive_ints("input_shape", input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"invalid num_classes={num_classes!r}: allowed a positive integer")
    options = dict(options or {})
    check_options(factory, options)
    try:
        model = fn(shape, int(num_classes), **options)
    except Exception as exc:  # the user's factory rejected these options or this input shape
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise ValueError(
            f"the model factory {describe(factory)!r} failed for input_shape={list(shape)}, "
            f"num_classes={num_classes} and {given}: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"the model factory {describe(factory)!r} returned {type(model).__name__}: allowed an nn.Module"
        )
    check_private_trainable(model)
    return model


def check_private_trainable(model: nn.Module) -> None:
    """Refuse layers that keep statistics of the training data outside the parameters (BatchNorm)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) or (
            isinstance(m, nn.modules.instancenorm._InstanceNorm) and m.track_running_stats
        ):
            raise ValueError(
                f"the model has {type(m).__name__} at {name or '<root>'!r}, which fedsim refuses: its running "
                "mean and variance are statistics of a client's examples kept outside the parameters, so "
                "they are neither clipped nor noised. Sharing them would release un-noised client data "
                "(breaking client-level DP); keeping them local would evaluate the global model with "
                "statistics no client trained. Use nn.GroupNorm (or nn.LayerNorm), which normalise each "
                "example on its own and hold only parameters."
            )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("the model has no trainable parameters")


# --------------------------------------------------------------------------- losses
IGNORE_INDEX = -100
"""A target id that is not scored (padding of a sequence): no loss, no gradient, not in token accuracy or
perplexity. PyTorch's own default ``ignore_index``."""


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy: of logits ``[n, classes]`` and labels ``[n]``; or, for a sequence task, of logits
    ``[n, *T, classes]`` and targets ``[n, *T]``, each example's mean over its scored tokens (targets other than
    :data:`IGNORE_INDEX`; an example with none scores 0). Per-example losses stay the clipping unit."""
    if targets.dim() <= 1:
        return F.cross_entropy(outputs, targets, reduction="none")
    n = targets.shape[0]
    per_token = F.cross_entropy(
        outputs.reshape(-1, outputs.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(n, -1)
    scored = (targets.reshape(n, -1) != IGNORE_INDEX).sum(1).clamp(min=1)
    return per_token.sum(1) / scored


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"cross_entropy": cross_entropy}
"""Losses named by a short name; any other loss is a ``"package.module:function"``."""


def resolve_loss(spec: Loss) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if isinstance(spec, str) and spec in LOSSES:
        return LOSSES[spec]
    if isinstance(spec, str) and not is_reference(spec):
        raise ValueError(
            f"invalid model.loss={spec!r}: allowed {', '.join(map(repr, LOSSES))} or 'package.module:function'"
        )
    return resolve(spec, "model.loss")


def resolve_metric(spec: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``model.metric``: ``None`` (none), or a ``"package.module:function"`` / callable giving one value per
    example."""
    if spec is None:
        return None
    if isinstance(spec, str) and not is_reference(spec):
        raise ValueError(f"invalid model.metric={spec!r}: allowed 'package.module:function'")
    return resolve(spec, "model.metric")


def per_example(
    loss: Callable[..., torch.Tensor], outputs: torch.Tensor, targets: torch.Tensor, what: str = "loss"
) -> torch.Tensor:
    """``loss(outputs, targets)``, checked to give one finite-shaped value per example."""
    out = loss(outputs, targets)
    if not isinstance(out, torch.Tensor) or out.shape != targets.shape[:1]:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"the {what} returned {shape} for outputs {list(outputs.shape)} and targets {list(targets.shape)}: "
            f"it must return one value per example, [{targets.shape[0]}] (e.g. F.cross_entropy(..., "
            "reduction='none'), or a mean over each example's tokens); fedsim averages them"
        )
    return out
