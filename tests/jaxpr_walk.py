"""A helper the operation-count tests of several packages share: every equation of a jaxpr, nested ones included."""

from collections.abc import Iterator

import jax.extend.core


def all_eqns(jaxpr: jax.extend.core.Jaxpr) -> Iterator[jax.extend.core.JaxprEqn]:
    """Every equation of `jaxpr` and of the jaxprs in its equations' parameters (jit, loops, conditionals)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)
