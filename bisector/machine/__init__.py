"""The machine a step runs on: interpreters, environments, GPUs, cache directories, compile caches, doctor.

Import each module itself: this package re-exports nothing."""
