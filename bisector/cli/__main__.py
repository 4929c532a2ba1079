"""`python -m bisector.cli`: the console script's `bisector`."""
from bisector.cli import main

main()
