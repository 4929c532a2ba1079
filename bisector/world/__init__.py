"""What a step stands on before its scenario runs: images, AITER installs, the world settings.

Import each module itself: this package re-exports nothing."""
