"""The one figure kit of the dashboard and the experiments: hand-written SVG (small, themed by
`currentColor`, CSP-safe, clickable through data attributes), colours, bar / line / scatter /
heatmap builders, the Figure type and one exporter per format.

Torch-free and web-free (no fastapi, no templates): the engine (`model_worker`) draws with it
too; the dashboard's figures of an analysis are built on it in `app.views.figures`."""
