"""What every settings group shares: each field names its option and the range its value must be in.

A group is a frozen dataclass (:class:`Group`) whose fields are made with :func:`option`: the option a
user types (``--lr``), the rule its value must satisfy (:class:`Rule`) and a line of documentation. A
group checks itself when it is built -- every rule, then the group's own cross-field rules
(:meth:`Group.check`) -- so a settings object that exists is a valid one, whoever built it (the command
line, a test, a script). :meth:`Group.options` lists the options a group takes, which is what a mode
declares it uses, and :meth:`Group.ignores` the options the group's own values leave unused (the rule
that refuses an option the run would ignore is built once on both: :meth:`hopdec.settings.RunSettings.unused`).

Every number has a range a machine can do, not only a sign: a rule names its limit in the error line
(``--lr 1e+300: must be a finite number in (0, 1000]``), so a huge finite value is refused before anything
starts instead of sleeping for years or overflowing float32 after setup.
"""

import math
from dataclasses import dataclass, field, fields

from hopdec.errors import ConfigError


def is_int(x):
    return not isinstance(x, bool) and isinstance(x, int)


def is_finite(x):
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class Rule:
    """What a value must be (``what``: words for the error line) and the test of it."""

    what: str
    test: object
    show: str = "str"               # how the error line shows the value: "str" or "repr"

    def check(self, option, value):
        if value is not None and not self.test(value):
            shown = repr(value) if self.show == "repr" else value
            raise ConfigError(f"{option} {shown}: must be {self.what}")


INT_AT_LEAST_1 = Rule("an integer >= 1", lambda x: is_int(x) and x >= 1)
INT_AT_LEAST_0 = Rule("an integer >= 0", lambda x: is_int(x) and x >= 0)
POSITIVE = Rule("a finite number > 0", lambda x: is_finite(x) and x > 0)
NON_NEGATIVE = Rule("a finite number >= 0", lambda x: is_finite(x) and x >= 0)
SECONDS_POSITIVE = Rule("a finite number of seconds > 0", lambda x: is_finite(x) and x > 0)
SECONDS_NON_NEGATIVE = Rule("a finite number of seconds >= 0", lambda x: is_finite(x) and x >= 0)
SECONDS = Rule("a finite number of seconds", is_finite)


def between(low, high, what="a finite number", integer=False, low_open=False):
    """A rule: ``low <= x <= high`` (``low < x`` with ``low_open``), an integer with ``integer``; the error
    line shows the range, e.g. ``must be a finite number in (0, 1000]``."""
    def test(x):
        if integer and not is_int(x):
            return False
        if not integer and not is_finite(x):
            return False
        return (x > low if low_open else x >= low) and x <= high
    return Rule(f"{what} in {'(' if low_open else '['}{low:g}, {high:g}]", test)


def not_empty(what="a path"):
    """A rule: a non-empty string (``--log-dir ''`` would write nothing, or into the working directory)."""
    return Rule(f"{what}, not empty", lambda x: isinstance(x, str) and x.strip() != "", show="repr")


def one_of(*choices):
    """A rule: the value is one of ``choices`` (shown in the error line)."""
    return Rule("one of " + ", ".join(choices), lambda x: x in choices, show="repr")


def option(flag, default=None, rule=None, doc=""):
    """A settings field: ``flag`` is the option that sets it (named in every error about it)."""
    return field(default=default, metadata={"option": flag, "rule": rule, "doc": doc})


class Group:
    """A frozen group of settings (subclasses are ``@dataclass(frozen=True)``); valid once built."""

    def __post_init__(self):
        for f in fields(self):
            rule = f.metadata.get("rule")
            if rule is not None:
                rule.check(f.metadata["option"], getattr(self, f.name))
        self.check()

    def check(self):
        """The group's rules between its own fields (ConfigError naming the options)."""

    def ignores(self, run):
        """``{option: why}``: options of this group that its own values (or the run's ``mode``) leave unused,
        e.g. ``--max-ig`` under a protocol without token queues; a run refuses them when they were typed."""
        return {}

    @classmethod
    def options(cls):
        """``{field: option}`` of every option this group takes."""
        return {f.name: f.metadata["option"] for f in fields(cls) if f.metadata.get("option")}
