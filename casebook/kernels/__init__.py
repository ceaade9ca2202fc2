"""Kernel modules: one per case (or family), named by the case, imported only by `casebook run`.

CASEBOOK_KERNELS_PATH (folders separated by os.pathsep) adds out-of-tree kernel modules, importable as
`casebook.kernels.<module>`: a contributor's work in progress, or the tests' deliberately broken kernels.
"""

import os

__path__ += [p for p in os.environ.get("CASEBOOK_KERNELS_PATH", "").split(os.pathsep) if p]
