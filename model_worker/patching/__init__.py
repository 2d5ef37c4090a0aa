"""Activation patching and attribution patching on unmodified Hugging Face modules (`hooks`:
the plumbing; `engine`: record, patched runs, attribution; `run`: one prompt's PatchingResult).
The pure parts (corruptions, pair checks, the metric) live in model_worker.analysis.patching.
A method: imports run/, model/, checks/ and analysis/; never service/."""
