"""Errors a user can cause: reported as one line, never a traceback."""


class HopdecError(ValueError):
    """Bad input (a file, an option, a setting). ``str(err)`` is the one line the user sees."""


class TopologyError(HopdecError):
    """A topology file that cannot be used: names the file and the problem."""


class ConfigError(HopdecError):
    """A command-line option or combination of options that cannot be used."""


class RunError(HopdecError):
    """A run that cannot go on (its loss is no longer a finite number, the parameter server died): one
    line, non-zero exit."""
