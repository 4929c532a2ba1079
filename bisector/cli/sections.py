"""--help in sections: a command's options listed under headings ("Range", "Outputs", ...), then its examples
and exit codes. The sections are one table per command (section title -> parameter names), kept beside it."""
from __future__ import annotations

from typing import Any, Sequence

import click

# Sections `run` and `backport` share (parameter names, as the commands receive them).
BUILD_AND_ENVIRONMENT = ("python", "build", "rocm_arch", "wheels", "allow_install_into_python", "cache_size",
                         "env_mode", "env_cache_size", "aiter", "aiter_cache_size", "aiter_prebuild", "aiter_repo")
IMAGES = ("image", "image_fallback", "container_runtime", "container_network", "image_cache_size")
RECORD_AND_CACHE = ("state_dir", "no_cache", "reuse_verdicts", "log_limit")


class SectionedCommand(click.Command):
    """A click command whose --help lists its options under the titles of sections (title -> parameter
    names, in the order shown; any option left out comes last, under "Other options"), then its examples
    (command lines, shown as written) and its exit codes."""

    def __init__(self, *args: Any, sections: dict[str, Sequence[str]], examples: Sequence[str] = (),
                 exit_codes: Sequence[tuple[int, str]] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sections, self.examples, self.exit_codes = sections, examples, exit_codes

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = [(param.name, param.get_help_record(ctx)) for param in self.get_params(ctx)
                   if isinstance(param, click.Option)]
        placed = {name for names in self.sections.values() for name in names}
        listed = [*self.sections.items(), ("Other options", [name for name, _ in records if name not in placed])]
        for title, names in listed:
            rows = [record for name in dict.fromkeys(names) for found, record in records
                    if found == name and record is not None]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if self.examples:
            with formatter.section("Examples"):
                for example in self.examples:  # as written: a command line is not rewrapped
                    formatter.write(f"{'':>{formatter.current_indent}}{example}\n")
        if self.exit_codes:
            with formatter.section("Exit codes"):
                formatter.write_dl([(str(code), meaning) for code, meaning in self.exit_codes])
