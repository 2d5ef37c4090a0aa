"""One module per model family, each defining `SPEC`; `_`-prefixed modules are shared."""
