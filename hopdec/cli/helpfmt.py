"""One ``--help`` style for every hopdec command: each option says its default once; one error style.

argparse's ``ArgumentDefaultsHelpFormatter`` appends ``(default: X)`` to every help text, which doubles
the defaults a text already explains ("(default 200) (default: None)") and prints ``None`` for options
whose default is decided later. :class:`HelpFormatter` appends ``(default: X)`` only where the text does
not mention its default itself and there is a real value to show.
"""

import argparse
import re
import sys


class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action):
        text = action.help or ""
        if (not text or "%(default)" in text or "default" in text.lower()
                or action.default is None or action.default is False or action.default == argparse.SUPPRESS
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse that raises a one-line :class:`hopdec.errors.ConfigError` (exit 2 via :mod:`hopdec.cli`)
    instead of printing usage and exiting, and names the option a mistyped one was meant to be
    (``--topolgy``: did you mean --topology?), which Python 3.11's argparse does not."""

    help_option = "--help"

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(_glue_negative_values(self, args), namespace)

    def error(self, message):
        from hopdec.errors import ConfigError, did_you_mean
        hint = ""
        if message.startswith("unrecognized arguments:"):
            known = sorted(_option_strings(self))
            given = message.split(":", 1)[1].split()
            words = [w.split("=", 1)[0] for w in given if w.startswith("--")]
            hint = next((h for h in (did_you_mean(w, known) for w in words) if h), "")
            if not hint and self.prog == "hopdec train" and ({"-n", "--np"} & set(given)):
                # `launch/local.sh --fault-tolerance -n 4`: the launcher reads -n only before the
                # command's own arguments
                hint = ("; the number of workers is the launcher's: launch/local.sh -n N [train args...] "
                        "(-n first), or mpirun -n N hopdec train ...")
        choice = _INVALID_CHOICE.search(message)
        if choice:                  # `--mode decentralised`: the close choice; `hierarchical`: both
            word, choices = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
            starts = [c for c in choices if word and c.startswith(word)]
            hint = (f"; did you mean {' or '.join(starts)}?" if 1 < len(starts) <= 3
                    else did_you_mean(word, choices))
        raise ConfigError(f"{message}{hint} (see {self.prog} {self.help_option})")


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def _glue_negative_values(parser, args):
    """``--staleness-range -1,3`` as ``--staleness-range=-1,3``: argparse takes a value that starts with a
    minus sign for an option unless it is a plain number, and says "expected one argument"; the option's
    own check then names what is wrong with the value. Only a minus followed by a digit or a point is glued
    (a missing value before another option, ``--log-dir --overwrite``, is still refused as missing)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:]
        action = parser._option_string_actions.get(a)
        if (action is not None and action.nargs is None and i + 1 < len(args)
                and _NEGATIVE.match(args[i + 1]) and args[i + 1] not in parser._option_string_actions):
            out.append(f"{a}={args[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


_NEGATIVE = re.compile(r"-[0-9.]")


def _option_strings(parser):
    """Every long option of ``parser`` and of its subcommands' parsers that its help shows (a hidden one,
    such as train's fault injection ``--die-at``, is never suggested: ``hopdec train --deaths`` pointed
    there)."""
    found = {o for o, a in parser._option_string_actions.items()
             if o.startswith("--") and a.help != argparse.SUPPRESS}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found
