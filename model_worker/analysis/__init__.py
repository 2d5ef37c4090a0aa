"""Pure maths on captured tensors: projections, increases, scores, flow, patching metrics, QK
attribution. Imports contracts/, common/ and resources/ only (no loading, queue, settings, web)."""
