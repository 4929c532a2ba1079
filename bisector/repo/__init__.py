"""The user's git repository: refs, tool-owned worktrees, picks, blame, pins, archives.

Import each module itself: this package re-exports nothing."""
