"""Execute docs/tour.ipynb, render it to HTML with nbconvert and screenshot it with headless
Chromium (Playwright): docs/notebook.png for the README.

    PYTHONPATH=. .venv/bin/python scripts/tour_screenshot.py [--theme light|dark] [--out PATH]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "notebook.png")
    parser.add_argument("--height", type=int, default=1500, help="Pixels of the page shown.")
    parser.add_argument("--cell", type=int, default=1, help="First code cell shown (from 0).")
    args = parser.parse_args()
    notebook = nbformat.read(ROOT / "docs" / "tour.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    exporter = HTMLExporter(template_name="lab", theme=args.theme)
    html, _ = exporter.from_notebook_node(notebook)
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        page_file = Path(folder) / "tour.html"
        page_file.write_text(html, encoding="utf-8")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": args.height})
        page.route("http*://**", lambda route: route.abort())  # offline: no CDN scripts
        page.goto(page_file.as_uri())
        # from the analysis cell on (the first one only loads the model)
        box = page.locator(".jp-CodeCell").nth(args.cell).bounding_box()
        top = box["y"] - 8 if box else 0
        page.set_viewport_size({"width": 1100, "height": int(top) + args.height})
        page.screenshot(
            path=str(args.out), clip={"x": 0, "y": top, "width": 1100, "height": args.height}
        )
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
