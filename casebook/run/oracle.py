"""The reference's answers and the traffic model, computed in a child of their own.

The float64 reference, the input maker and the traffic model live in the case's kernel module, beside the
variants: contributed code, so the parent does not run them. They run here, in a child that imports the
module and never calls a variant: whatever a variant does in its own process (rebinding torch functions,
caching, patching casebook) cannot reach the answers it is judged against. The reference itself is the
contributor's, and review reads it: a float64 formula a few lines long, the case's definition of right.

The inputs are made again from the seeds the variant's child used (`make_inputs` is deterministic in its
generator), so the parent never needs the variant's inputs, only its outputs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from casebook.run.check import TORCH_DTYPES, reference_inputs
from casebook.run.inputs import make


@dataclass(frozen=True)
class OracleTask:
    """The reference's outputs at `seeds`, and (with `traffic`) the traffic model, at one shape and dtype."""

    module: str
    shape: dict
    dtype: str
    device: str
    seeds: tuple = ()
    reference: str = "reference"
    inputs: str = "inputs"
    traffic: str = ""


def shipped(t, dtype: str, device: str):
    """A reference output as it crosses to the parent: float32 from a GPU (half the bytes; its rounding,
    6e-8, is far under every bound but fp64's), float64 from a CPU and for fp64."""
    import torch

    if t.is_floating_point() and device == "cuda" and dtype != "fp64":
        return t.to(torch.float32)
    return t


def work(task: OracleTask) -> dict:
    """Entry point in the child."""
    import torch

    from casebook.kernels import __name__ as package

    mod = importlib.import_module(f"{package}.{task.module}")
    dtype = TORCH_DTYPES[task.dtype]
    out: dict = {"status": "ok", "expected": {}}
    if task.seeds:
        reference, make_inputs = getattr(mod, task.reference), getattr(mod, task.inputs)
        for seed in task.seeds:
            inputs = make(make_inputs, task.shape, dtype, task.device, seed)  # under zero: a blended set
            expected = reference(**reference_inputs(reference, inputs))
            items = list(expected) if isinstance(expected, tuple) else [expected]
            out["expected"][str(seed)] = {"tuple": isinstance(expected, tuple),
                                          "outputs": [shipped(e.detach(), task.dtype, task.device) for e in items]}
            del inputs, expected, items
        if task.device == "cuda":  # the float64 work's memory back to the device: the variant's child needs it
            torch.cuda.empty_cache()
    if task.traffic:
        traffic = getattr(mod, task.traffic)(task.shape, dtype)
        out["traffic"] = traffic.as_dict()
    return out
