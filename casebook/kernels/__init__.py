"""Kernel modules: one per case (or family), named by the case, imported only by `casebook run`."""
