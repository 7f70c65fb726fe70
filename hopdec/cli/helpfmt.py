"""One ``--help`` style for every hopdec command: each option says its default once.

argparse's ``ArgumentDefaultsHelpFormatter`` appends ``(default: X)`` to every help text, which doubles
the defaults a text already explains ("(default 200) (default: None)") and prints ``None`` for options
whose default is decided later. :class:`HelpFormatter` appends ``(default: X)`` only where the text does
not mention its default itself and there is a real value to show.
"""

import argparse


class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action):
        text = action.help or ""
        if (not text or "%(default)" in text or "default" in text.lower()
                or action.default is None or action.default is False or action.default == argparse.SUPPRESS
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"
