"""Options as tables. Each sample kind and each container writer lists its conversion options in
its ``OPTIONS``, and ``packdata bench`` its own (:mod:`packdata.bench.settings`): the one place
that gives their names, types, defaults and help, read by the library itself (:func:`resolve`)
and by the command line (one flag per option, unless ``on_command_line=False``)."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from packdata.errors import OptionError


@dataclass(frozen=True)
class Option:
    """One option: of a sample kind, a container's writer, or ``packdata bench``."""

    name: str
    type: type  # what the command line parses: str, int, float, bool or pathlib.Path
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    #: whether ``packdata convert`` has a flag for it (else it is set another way, e.g. by DST)
    on_command_line: bool = True
    #: what a manifest that does not record this option meant (one written before the option
    #: existed), where that differs from ``default``; None: the default
    legacy: Any = None
    #: the command line's spellings where they are not ``--NAME``: another name with a short
    #: one (``("--format", "-f")``), or a bool's on/off pair (``("--warm/--cold",)``)
    flags: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The flag that gives it (its first spelling)."""
        return self.flags[0].split("/")[0] if self.flags else "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """``value`` if it fits this option, else an OptionError naming option and value."""
        if value is None:
            return value
        if self.choices and value not in self.choices:
            raise OptionError(f"{self.flag} '{value}': expected one of {', '.join(self.choices)}")
        numeric = {int: numbers.Integral, float: numbers.Real}.get(self.type)
        if (numeric or self.type is bool) and (
            isinstance(value, bool) != (self.type is bool)
            or not isinstance(value, numeric or bool)
        ):
            raise OptionError(f"{self.flag} {value!r}: expected {self.type.__name__}")
        return value


def resolve(kind: str, options: Iterable[Option], given: dict[str, Any],
            what: str = "sources") -> dict[str, Any]:
    """Every option of ``kind``: the given value, checked, or its default. An option the kind
    does not have is an OptionError naming the kind and listing the ones it has (as flags:
    ``--max-size``, the command line's names; the keyword is the same with ``_``)."""
    table = {o.name: o for o in options}
    unknown = [name for name in given if name not in table]
    if unknown:
        flag = "--" + unknown[0].replace("_", "-")
        raise OptionError(f"option {flag} does not apply to {kind} {what} (theirs: "
                          f"{', '.join(o.flag for o in table.values()) or 'none'}; see "
                          "`packdata convert --help`)")
    return {name: o.check(given.get(name, o.default)) for name, o in table.items()}
