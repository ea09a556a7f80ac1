"""Weight preparation: each candidate of a layer's chain gets its own layout of the weights.

For an op whose contract lists ``weights`` (the quantized ops), an implementation may carry a
``prepare`` step (:attr:`~sglang_fl.dispatch.types.OpImpl.prepare`). When a layer's weights
are final, :func:`prepare_chain` runs it once for every candidate of the resolution's chain and
returns that layer's chain: each candidate's ``fn`` closed over what it prepared, so a call the
chosen kernel declines reaches the next candidate with *its* layout (the reference's is the
checkpoint's own), never with a layout made for another kernel. A candidate whose ``prepare``
declines the layer (:class:`~sglang_fl.errors.Unsupported`) is left out of that layer's chain,
with its reason. The callers pass the checkpoint-layout weights on every call; verify mode
hands those to the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import NoImplementationError, StrictModeError, Unsupported
from ..ops import OpContract, get_contract
from .types import OpImpl

__all__ = ["PreparedChain", "prepare_chain", "prepared_weights", "with_weights"]


def prepared_weights(
    contract: OpContract, impl: OpImpl, obj: Any, weights: tuple[Any, ...]
) -> tuple[Any, ...]:
    """What ``impl`` wants in place of ``weights`` (the contract's, in its order): its
    ``prepare(obj, *weights)``, checked to be a tuple of as many values; ``weights`` itself
    without a prepare step. ``Unsupported`` from the step propagates (it declines the layer)."""
    if impl.prepare is None:
        return weights
    prepared = impl.prepare(obj, *weights)
    if not isinstance(prepared, tuple) or len(prepared) != len(weights):
        got = (
            f"a tuple of {len(prepared)}"
            if isinstance(prepared, tuple)
            else type(prepared).__name__
        )
        raise TypeError(
            f"{impl.impl_id}: prepare for op {contract.name!r} returned {got}; expected a tuple "
            f"of {len(weights)} values, in the order {', '.join(contract.weights)}"
        )
    return prepared


def with_weights(
    contract: OpContract, args: tuple[Any, ...], kwargs: dict[str, Any], weights: tuple[Any, ...]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments (after ``obj``) with the contract's weights replaced by ``weights``."""
    positions = contract.weight_positions()
    new_args = list(args)
    new_kwargs = dict(kwargs)
    for name, position, value in zip(contract.weights, positions, weights, strict=True):
        if position < len(new_args):
            new_args[position] = value
        else:
            new_kwargs[name] = value
    return tuple(new_args), new_kwargs


def _bound_to(
    contract: OpContract, fn: Callable[..., Any], prepared: tuple[Any, ...]
) -> Callable[..., Any]:
    """``fn`` receiving ``prepared`` in place of whatever weights a call passes."""
    positions = contract.weight_positions()
    last = max(positions)
    pairs = tuple(zip(positions, prepared, strict=True))

    def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > last and not kwargs:  # the engines' calls: every weight positional
            values = list(args)
            for position, value in pairs:
                values[position] = value
            return fn(obj, *values)
        args, kwargs = with_weights(contract, args, kwargs, prepared)
        return fn(obj, *args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "prepared")
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


@dataclass(frozen=True)
class PreparedChain:
    """One layer's candidates, each bound to the weights it prepared, and those that declined.

    ``chain`` holds copies of the resolution's implementations (same ids, kinds, provenance)
    whose ``fn`` takes the op's standard arguments and substitutes that candidate's prepared
    weights; ``declined`` pairs each candidate whose ``prepare`` declined this layer with why.
    """

    op: str
    chain: tuple[OpImpl, ...]
    declined: tuple[tuple[OpImpl, str], ...]


def prepare_chain(
    op_name: str,
    candidates: Sequence[OpImpl],
    obj: Any,
    weights: tuple[Any, ...],
    *,
    strict: bool = False,
) -> PreparedChain:
    """Run each candidate's ``prepare`` on ``weights`` (the layer's, checkpoint layout), in order.

    Under ``strict`` (``SGLANG_FL_STRICT=1``) a decline is a :class:`StrictModeError`; a layer
    no candidate accepts is a :class:`NoImplementationError` naming every decline.
    """
    contract = get_contract(op_name)
    chain: list[OpImpl] = []
    declined: list[tuple[OpImpl, str]] = []
    for impl in candidates:
        try:
            prepared = prepared_weights(contract, impl, obj, weights)
        except Unsupported as exc:
            if strict:
                raise StrictModeError(
                    f"SGLANG_FL_STRICT=1: {impl.impl_id} declined to prepare the weights of a "
                    f"{op_name} layer ({exc})"
                ) from exc
            declined.append((impl, str(exc)))
            continue
        fn = impl.fn if prepared is weights else _bound_to(contract, impl.fn, prepared)
        chain.append(replace(impl, fn=fn, prepare=None))
    if not chain:
        reasons = "; ".join(f"{impl.impl_id}: {why}" for impl, why in declined)
        raise NoImplementationError(
            f"no implementation of op {op_name!r} accepts this layer's weights ({reasons})", None
        )
    return PreparedChain(op_name, tuple(chain), tuple(declined))
