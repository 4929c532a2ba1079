"""Presentation: renderers by format and run kind, the performance report and plot, format names.

Import each module itself: this package re-exports nothing."""
