"""Pure decisions: the commit DAG, the search policies, performance statistics, seeds (no git, no subprocess).

Import each module itself: this package re-exports nothing."""
