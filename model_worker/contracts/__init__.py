"""Pydantic request/result contracts shared by the web tier (`app/`) and the engine, one module
per kind, each imported from where it lives: `analysis` (an analysis' request and result),
`experiments` (the registry, request and result), `patching`, `towers`, `figures` (figure data),
`report` (a report as data), `evidence` (intervals, verdicts), `caveats` (coded warnings) and
`common` (head names, fp32 numbers, top tokens, the schema version). Nothing here imports torch.
"""
