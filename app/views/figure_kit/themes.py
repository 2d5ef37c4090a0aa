"""The figures' themes: Vega-Lite config objects applied when a figure is drawn (on the page,
in a download, in a notebook), never stored with a result.

`light` and `dark` follow the page's colours; `presentation` and `presentation-dark` scale
every text with the page's presentation mode (21 px against 15 px) on pure white or black.
The smallest text of a theme (tick labels) is 11 px, 15 px in presentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from app.views.figure_kit.colors import DARK_OF

Theme = Literal["light", "dark", "presentation", "presentation-dark"]
THEMES: tuple[Theme, ...] = get_args(Theme)
Mode = Literal["light", "dark"]
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"

#: (background, text, secondary text, grid) of each theme: the page's card colours
_COLOURS: dict[Theme, tuple[str, str, str, str]] = {
    "light": ("#ffffff", "#1b1f24", "#5b6470", "#e2e5ea"),
    "dark": ("#171b22", "#e8ebf0", "#9aa4b2", "#2a313c"),
    "presentation": ("#ffffff", "#000000", "#333a44", "#c9ced6"),
    "presentation-dark": ("#000000", "#ffffff", "#d0d6de", "#3b424c"),
}
#: (tick labels, axis and legend titles, figure title) in px
_SIZES = {False: (11, 12, 14), True: (15, 17, 20)}


def mode(theme: Theme) -> Mode:
    """The colour mode of `theme` (which label colours it draws with)."""
    return "dark" if theme.endswith("dark") else "light"


def is_large(theme: Theme) -> bool:
    """Whether `theme` has the presentation mode's large text."""
    return theme.startswith("presentation")


def page_theme(theme: str, present: bool) -> Theme:
    """The theme of a page in colour `theme` (`light`, `dark`; `auto` reads as light: the
    browser swaps to the dark one when the system asks for it) and presentation mode."""
    dark = theme == "dark"
    if present:
        return "presentation-dark" if dark else "presentation"
    return "dark" if dark else "light"


def config(theme: Theme) -> dict[str, Any]:
    """The Vega-Lite `config` of `theme`."""
    background, text, secondary, grid = _COLOURS[theme]
    label, title, heading = _SIZES[is_large(theme)]
    axis = {
        "labelFontSize": label,
        "titleFontSize": title,
        "titleFontWeight": 600,
        "labelColor": text,
        "titleColor": text,
        "domainColor": secondary,
        "tickColor": secondary,
        "gridColor": grid,
        "labelLimit": 12 * label,
        # an axis that thins its labels (labelOverlap) keeps a third of a label's size
        # between them: "10 11 12", never "101112"
        "labelSeparation": label // 3,
        "titleLimit": 30 * label,
    }
    return {
        "font": FONT,
        "background": background,
        "padding": 6,
        "view": {"stroke": None},
        "axis": axis,
        "legend": {
            "labelFontSize": label,
            "titleFontSize": title,
            "titleFontWeight": 600,
            "labelColor": text,
            "titleColor": text,
            "labelLimit": 20 * label,
            "symbolSize": 8 * label,
        },
        "header": {"labelFontSize": label, "titleFontSize": title, "labelColor": text},
        "title": {
            "fontSize": heading,
            "fontWeight": 600,
            "color": text,
            "anchor": "start",
            "limit": 60 * heading,
            "offset": label,
            "subtitleFontSize": title,
            "subtitleColor": secondary,
        },
        "text": {"fontSize": label, "color": text},
        "mark": {"color": text},
        "rule": {"color": secondary},
    }


def figure_theme(prefs: Mapping[str, Any]) -> Theme:
    """The theme of a page's figures from its view preferences (`theme`, `present`)."""
    return page_theme(str(prefs.get("theme", "light")), bool(prefs.get("present", False)))


def auto_dark() -> dict[str, Any]:
    """What a page in the `auto` colour theme needs to draw its (light) figures dark when the
    system asks for dark (static/js/figures.js): the dark theme's config and each light colour's
    dark counterpart (the same swap as Figure.spec's for `dark`)."""
    return {"config": config("dark"), "recolour": DARK_OF}
