"""`casebook run` as stages, each a module with one job: `plan` (a case and a machine to tasks),
`child` (what a variant's process does), `oracle` (the reference's), `transport` (how answers cross),
`judge` (the untrusted answer to a point), `assemble` (the result), `orchestrate` (`run_case`).
"""
