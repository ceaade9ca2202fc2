"""casebook: GPU operator-optimisation case studies whose entries run."""

__version__ = "0.1.0"
