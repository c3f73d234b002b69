"""Files written so that a crash never leaves half of one."""
import os
import tempfile


def atomic_write(path, data):
    """Write `data` (bytes or str, str as UTF-8) to `path`: into a temporary file in the same folder, flushed to
    disk, then renamed over `path` (os.replace is atomic on one file system); the temporary file is removed if
    anything fails."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
