"""The record: the SQLite store, steps as they land, typed results.

Import each module itself: this package re-exports nothing."""
