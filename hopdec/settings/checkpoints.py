"""Checkpoints and resuming (``--checkpoint-dir D``, ``--checkpoint-every K``, ``--resume D``). What a
resumed run takes from the checkpoint it resumes (its ``--iterations``, ``--checkpoint-every``) is read on
every rank where the run starts (:func:`hopdec.runtime.resume.with_checkpoint_defaults`)."""

import os
from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import Group, between, not_empty, option
from hopdec.settings.work import MAX_ITERATIONS


@dataclass(frozen=True)
class Checkpoints(Group):
    every: int = option("--checkpoint-every", None, between(1, MAX_ITERATIONS, "an integer", integer=True),
                        "iterations per worker between checkpoints")
    dir: str = option("--checkpoint-dir", None, not_empty("a directory"), "where each rank writes D/rank{r}/")
    resume: str = option("--resume", None, not_empty("a directory"),
                         "continue from the latest checkpoint in D every rank has")
    resume_at: int = option("--resume-at", None, between(0, MAX_ITERATIONS, "an integer", integer=True),
                            "with --resume: start from checkpoint K instead of the latest")

    def check(self):
        if self.resume is not None and self.dir is not None and \
                os.path.abspath(self.dir) != os.path.abspath(self.resume):
            raise ConfigError(f"--checkpoint-dir {self.dir} with --resume {self.resume}: a resumed run goes on "
                              f"checkpointing into {self.resume} (drop --checkpoint-dir)")
        if self.resume_at is not None and self.resume is None:
            raise ConfigError(f"--resume-at {self.resume_at} needs --resume D (where the checkpoints are)")
        if self.every is not None and self.directory is None:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir D (where the checkpoints go)")

    @property
    def directory(self):
        """Where this run writes its checkpoints (a resumed run: where it resumes from), or None."""
        return self.resume if self.resume is not None else self.dir
