"""Progress bars for long work, from tqdm where it is installed (it is optional: no bar where it is not)."""


def progress_bar(total, desc, unit):
    """A tqdm bar of `total` `unit`s with a rate and an ETA; None where tqdm is not installed. Off (None-like, a
    disabled bar) when stderr is not a terminal, so logs stay readable."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, disable=None)
