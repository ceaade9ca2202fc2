"""The site's fixed words: what each bottleneck and pattern means, in the method's terms."""

from __future__ import annotations

BOTTLENECKS = {
    "bandwidth": ("Bandwidth-bound",
                  "Few FLOPs per byte: the arithmetic intensity sits below the ridge point, so the conveyor belt, "
                  "not the workers, sets the pace. Only moving fewer bytes helps: fusion, layout, vectorised "
                  "access, fewer write-backs."),
    "compute": ("Compute-bound",
                "Many FLOPs per byte: above the ridge point. Push toward the compute roof: tiles that reuse "
                "data on chip, tensor cores, a better instruction mix."),
    "launch": ("Launch-bound",
               "Too little work per launch to hide the launch itself: time is set by launches and scheduling, "
               "not by FLOPs or bytes. Fewer launches: fusion, persistent kernels, CUDA graphs."),
    "layout": ("Layout-bound",
               "The data arrives in the wrong order: strided or uncoalesced access, transposes, padding. Fix the "
               "layout, or tile so that every access is contiguous."),
    "mixed": ("Mixed: different stages, different limits",
              "The stages of one operator sit on different sides of the ridge (attention prefill vs decode): "
              "split the case by stage and treat each with its own fix."),
}

PATTERNS = {
    "tiling": ("Tiling",
               "Blocks sized to registers and shared memory so that every byte fetched feeds many FLOPs: raises "
               "the arithmetic intensity. The lever for compute-bound kernels."),
    "fusion": ("Fusion",
               "Several ops in one pass, so that intermediates never make a round trip through device memory: "
               "cuts bytes and launches. The lever for bandwidth- and launch-bound kernels."),
    "online_reduction": ("Online reduction",
                         "A reduction (max, sum, log-sum-exp, mean and variance) kept as running statistics in one "
                         "streaming pass, so that a long row is neither held whole nor read twice."),
    "persistent": ("Persistent kernels",
                   "One launch with as many programs as the machine holds, looping over the work inside: removes "
                   "launch and tail costs. The lever for small, fragmented problems."),
    "specialization": ("Specialisation",
                       "Different code for different shapes, dtypes or stages (row length, decode vs prefill, "
                       "alignment): each regime gets the variant that fits it."),
}

REGIME_MARK = {"bandwidth": "bandwidth", "compute": "compute", "launch": "launch"}
CLAIM_MARK = {True: ("held", "cb-held", "✓"), False: ("failed", "cb-failed", "✗"), None: ("n/a", "cb-na", "–")}
