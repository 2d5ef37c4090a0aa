"""Torch-free checks of what a user asks and what a result means: argument checks before a model
loads, the cost budget, patch-pair checks, a result's coded warnings. Imports contracts/ and
common/."""
