"""The LM head's gradient under FSDP2 when TRL reads the head's weight directly (its fused log-probability head).

TRL 1.16's fused LM head (``trl/trainer/utils.py``, ``add_fused_lm_head``: ``_fused_forward``, lines 1631-1639 of the
installed trl 1.16.0) never calls the head module: it reads ``lm_head.weight`` and, for an FSDP2 DTensor, gathers it
with ``weight.full_tensor()``. The backward of that gather keeps each process's own slice of its own gradient
(``grad_placements`` defaults to the output's ``Replicate``), so the head's gradient is not averaged across
processes as FSDP2 averages every other parameter's (and as DDP does): on 2 gloo processes the step-1 gradient norm
came out 5.6% above the 1-process run's with every strategy, while the loss matched
(tests/integration/test_multiprocess.py::test_fsdp2_matches_one_process).

:func:`averaged_head_gradient` hands TRL's fused head, for the duration of the loss forward, an LM head whose weight
(and bias) are already gathered with ``full_tensor(grad_placements=[Partial("avg")])``: the backward then
reduce-scatters the head's gradient with averaging, exactly as FSDP2 does for the unit's own forward. Nothing
changes when the head is not a DTensor.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace


def _averaged_full(parameter):
    if parameter is None or not hasattr(parameter, "full_tensor"):
        return parameter
    from torch.distributed.tensor import Partial

    return parameter.full_tensor(grad_placements=[Partial("avg")] * parameter.device_mesh.ndim)


@contextlib.contextmanager
def averaged_head_gradient(lm):
    """While inside, ``lm.get_output_embeddings()`` returns the head with its DTensor weight and bias gathered so
    that their gradients are averaged across processes (module docstring); a no-op for a head that is not sharded."""
    head = lm.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is None or not hasattr(weight, "full_tensor"):
        yield
        return
    gathered = SimpleNamespace(weight=_averaged_full(weight), bias=_averaged_full(getattr(head, "bias", None)))
    lm.get_output_embeddings = lambda: gathered  # an instance attribute shadows the method for TRL's lookup
    try:
        yield
    finally:
        del lm.get_output_embeddings
