"""Files that appear whole or not at all: every writer of a file another process may read while
it is written (checkpoint pointers and layout, the data index caches, preprocessed .bin / .idx)
writes `<path>.tmp<pid>` and renames it into place. A reader never sees a half-written file,
even if the writer dies; the pid keeps two writers of one path (two launches sharing a data
cache) from writing into each other's temporary file.
"""
import os
from types import TracebackType
from typing import IO


class AtomicFile:
    """An open temporary file that `commit()` renames to `path` (after fsync, so that a crash
    right after the rename cannot leave an empty file under the final name) and `discard()`
    removes. As a context manager it yields the file object and commits on success, discards
    on an exception. For a file written over a long time (MMapIndexedDatasetBuilder's .bin),
    keep the object and call commit() yourself."""

    def __init__(self, path: str, mode: str = "w") -> None:
        self.path = path
        self.tmp = f"{path}.tmp{os.getpid()}"
        self.file: IO = open(self.tmp, mode)

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.file.close()
        if os.path.exists(self.tmp):
            os.remove(self.tmp)

    def __enter__(self) -> IO:
        return self.file

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_atomic(path: str, data: str | bytes) -> None:
    """Writes `data` (text or bytes) to `path` through a temporary file."""
    with AtomicFile(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
