"""The figure kit: every figure of the dashboard, the notebooks and the experiments is a
Vega-Lite specification built with Altair (app.views.figures); this package holds what they
share: the Figure type, colours, themes (Vega-Lite config objects), number and token texts, and
the files a figure downloads as (SVG and PNG drawn off-screen by vl-convert, in a bounded pool of
processes on the server; CSV of its rows; JSON of its specification). Torch-free."""
