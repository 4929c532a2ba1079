"""The report formats, by the name `bisector report --format` takes; bisector.report.renderers renders them.

Kept apart from the renderers so that the command line lists them without importing bisector.report.renderers.
"""
from __future__ import annotations

FORMATS = ("text", "json", "markdown", "junit", "html")
