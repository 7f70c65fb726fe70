"""Errors a user can cause: reported as one line, never a traceback."""


def closest(word, choices, cutoff=0.75):
    """The choice most like ``word`` (a mistyped name), or None: what an error's line suggests instead."""
    import difflib
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word, choices, cutoff=0.75):
    """``"; did you mean X?"`` for the choice most like ``word``, or ``""`` when none is close."""
    found = closest(word, choices, cutoff)
    return f"; did you mean {found}?" if found else ""


class HopdecError(ValueError):
    """Bad input (a file, an option, a setting). ``str(err)`` is the one line the user sees."""


class TopologyError(HopdecError):
    """A topology file that cannot be used: names the file and the problem."""


class ConfigError(HopdecError):
    """A command-line option or combination of options that cannot be used."""


class RunError(HopdecError):
    """A run that cannot go on (its loss is no longer a finite number, the parameter server died): one
    line, non-zero exit."""
