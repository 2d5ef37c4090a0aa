"""Server-rendered SVG figures of an analysis, with their data as rows for CSV/JSON export."""
