"""The traffic model: FLOPs and bytes a kernel must move, term by term, next to the code."""

from __future__ import annotations

from dataclasses import dataclass, field

from casebook.result import TrafficTerm as Term


@dataclass(frozen=True)
class Traffic:
    """The fewest bytes and FLOPs a kernel must do at one shape: the roofline's floor."""

    terms: list[Term] = field(default_factory=list)

    @property
    def bytes(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def flops(self) -> float:
        return sum(t.flops for t in self.terms)

    @property
    def link_bytes(self) -> float:
        """The part of `bytes` that crosses the link between devices."""
        return sum(t.bytes for t in self.terms if t.link)

    def as_dict(self) -> dict:
        out = {"bytes": self.bytes, "flops": self.flops,
               "terms": [{"name": t.name, "bytes": t.bytes, "flops": t.flops, **({"link": True} if t.link else {})}
                         for t in self.terms]}
        if any(t.link for t in self.terms):
            out["link_bytes"] = self.link_bytes
        return out


INTENSITY_TOLERANCE = 0.10
"""The most a case's declared `bottleneck.arithmetic_intensity` may differ from its traffic model's at the
case's first level-1 shape and dtype (relative to the model's); `casebook check` flags more."""
