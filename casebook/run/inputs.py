"""A call's inputs by seed, made alike in the variant's child and in the reference's: the case's own input maker
at a seed, or (a seed under zero) that input set with a few of its values moved during timing (`blend`).

A variant may keep an answer by its inputs' memory and a few of their values, one slot per input set: every
timed repetition after the first is then a lookup that returns the right output. So once during a timing,
before a repetition chosen at random, one input set has `BLEND_FRACTION` of each floating tensor's elements, at
random places, replaced by the values of other random places of the same tensor (its own values: the inputs
stay as the case makes them). The places come from the operating system's randomness, drawn when the blend is
made: the variant cannot know them in advance. That repetition's output is kept whatever the sample, and judged
against the reference's answer on the blended set, named by `blended_name` (the set's seed and the blend's,
as one negative number). A lookup that reads only a few values misses the change and returns the old answer;
one that reads every value costs what reading the inputs costs, which the roofline's floors bound.
"""

from __future__ import annotations

import math

import torch

BLEND_FRACTION = 0.01
"""Of each floating input tensor, the share of elements a blend moves: at any shape, most rows of the output
change by far more than any dtype's bound (softmax over 4,096 columns: about 10% of each row's norm)."""

BLEND_BITS = 32
"""Bits of a blend's own seed in its set's name (`blended_name`)."""


def blends(task) -> bool:
    """Whether `task`'s timing blends an input set (`child._Sampler`): a timed single-device call observed
    repetition by repetition (not under CUDA-graph replay, whose calls are not seen one by one; not on ranks in
    lockstep), over at least two repetitions."""
    protocol = task.protocol
    return (bool(task.timed) and task.devices == 1 and not protocol.rank_barrier
            and not (protocol.graph and task.device == "cuda") and protocol.min_reps >= 2)


def blended_name(seed: int, blend_seed: int) -> int:
    """The name of the set at `seed` blended by `blend(inputs, blend_seed)`: a negative number."""
    return -((seed << BLEND_BITS) | blend_seed) - 1


def unblended(name: int) -> tuple[int, int | None]:
    """(the set's seed, the blend's seed or None) from a set's name."""
    if name >= 0:
        return name, None
    packed = -name - 1
    return packed >> BLEND_BITS, packed & ((1 << BLEND_BITS) - 1)


def make(make_inputs, shape: dict, dtype: torch.dtype, device: str, name: int) -> dict:
    """The inputs a set's name stands for: the case's at its seed, blended where it names a blend."""
    seed, blend_seed = unblended(name)
    inputs = make_inputs(shape, dtype, device, torch.Generator().manual_seed(seed))
    if blend_seed is not None:
        blend(inputs, blend_seed, derived_of(make_inputs))
    return inputs


def derived_of(make_inputs):
    """The case's function that recomputes the inputs derived from the others (a forward's saved statistics, which
    a backward reads instead of recomputing), given as the inputs function's `derived` attribute; None if none."""
    derived = getattr(make_inputs, "derived", None)
    return derived if callable(derived) else None


def blend(inputs: dict, blend_seed: int, derived=None) -> None:
    """Move `BLEND_FRACTION` of each floating tensor's elements, in place (the same memory): the places from a
    generator on the tensor's own device seeded with `blend_seed` (one a device, drawn from in the order the case
    makes the tensors: the variant's child and the reference's, on the same device, draw the same places). On a
    GPU the places never cross the host: drawn and sorted on the host, a 128 M-element input's took 0.1 s, at
    every timed point and again in the reference's child. Then the inputs `derived` recomputes (`derived_of`) are
    written again from the blended ones, into their own memory: a saved statistic moved to another row would hand
    the kernel a set it is never given (the rmsnorm backward's rows then disagreed with the reference, which
    recomputes the statistic, by the spread of the rows' norms)."""
    generators: dict = {}
    for t in inputs.values():
        if not (torch.is_tensor(t) and t.is_floating_point() and t.numel() >= 2):
            continue
        g = generators.get(t.device)
        if g is None:
            g = generators[t.device] = torch.Generator(device=t.device).manual_seed(blend_seed)
        n = math.ceil(t.numel() * BLEND_FRACTION)
        to = torch.unique(torch.randint(t.numel(), (n,), generator=g, device=t.device))  # each place written once
        frm = torch.randint(t.numel(), (n,), generator=g, device=t.device)[: to.numel()]
        with torch.no_grad():
            if t.is_contiguous():  # places in the flat view: unravel_index's first call on a GPU took 3 s
                flat = t.view(-1)
                flat[to] = flat[frm]
            else:
                t[torch.unravel_index(to, t.shape)] = t[torch.unravel_index(frm, t.shape)]
    if derived is not None:
        with torch.no_grad():
            for name, value in derived(inputs).items():
                inputs[name].copy_(value)
