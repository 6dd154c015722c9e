"""What a command prints also goes into its run folder's log file (``train.log``, ``eval.log``, ...).

Hydra's job logging writes ``<run folder>/<command>.log`` with the log records only; the commands print their
results and progress bars, so the file stayed empty. ``console_log`` copies stdout and stderr into it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any


class _Tee:
    """A console stream that also writes its complete lines into a log handler's file (a progress bar's last
    state only: text before a ``\\r`` in a line is dropped)."""

    def __init__(self, stream, handler):
        self.stream, self.handler, self.pending = stream, handler, ""

    def write(self, text: str) -> int:
        """Write to the console, and each finished line to the log file."""
        n = self.stream.write(text)
        self.pending += text
        if "\n" in self.pending:
            *lines, self.pending = self.pending.split("\n")
            self._to_file("".join(line.rsplit("\r", 1)[-1] + "\n" for line in lines))
        return n

    def _to_file(self, text: str) -> None:
        h = self.handler
        h.acquire()
        try:
            if h.stream is not None and text:
                h.stream.write(text)
                h.stream.flush()
        except (OSError, ValueError):  # the log file went away (a discarded run folder): the console still has it
            pass
        finally:
            h.release()

    def close_line(self) -> None:
        """Write an unfinished last line (a progress bar's final state) to the log file."""
        if self.pending.rsplit("\r", 1)[-1].strip():
            self._to_file(self.pending.rsplit("\r", 1)[-1] + "\n")
        self.pending = ""

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class console_log:
    """Inside a Hydra job: what the command prints (stdout and stderr) also goes into the job's log file
    (``train.log``), next to Hydra's log records, and so does the traceback of an error that ends the command.
    Outside one, nothing changes."""

    def __enter__(self):
        from hydra.core.hydra_config import HydraConfig

        handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
        self.saved = sys.stdout, sys.stderr
        if handlers and HydraConfig.initialized():
            sys.stdout, sys.stderr = _Tee(sys.stdout, handlers[-1]), _Tee(sys.stderr, handlers[-1])
        return self

    def __exit__(self, kind, error, tb):
        for tee in (sys.stdout, sys.stderr):
            if isinstance(tee, _Tee):
                tee.close_line()
        if error is not None and not isinstance(error, (SystemExit, KeyboardInterrupt)) \
                and isinstance(sys.stderr, _Tee):
            # An unexpected error: Hydra prints its traceback to the console after this block; the log keeps it too.
            sys.stderr._to_file("".join(traceback.format_exception(kind, error, tb)))
        sys.stdout, sys.stderr = self.saved
