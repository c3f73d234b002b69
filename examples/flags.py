"""What the examples' command lines share: a renamed flag keeps its old name working, hidden from --help, so that
scripts and habits written against the old name still run while the warning points them at the new one."""
import argparse
import sys


class _OldName(argparse.Action):
    """An old name of a flag: it does what the new one does, after one warning on stderr that names the new one
    (as argparse's `deprecated=True`, Python 3.13, does)."""

    def __init__(self, option_strings, dest, new, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.warned = new, False

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.warned:
            print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
            self.warned = True
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_old_name(parser, old, new):
    """Make `old` a hidden name of `parser`'s flag `new` (added before): the same value, one warning when used."""
    flag = next(a for a in parser._actions if new in a.option_strings)
    if flag.nargs == 0:  # a switch (store_true)
        kind = dict(nargs=0, const=flag.const)
    else:
        kind = dict(type=flag.type, choices=flag.choices, metavar=flag.metavar)
    parser.add_argument(old, dest=flag.dest, action=_OldName, new=new, help=argparse.SUPPRESS, **kind)


def apply_preset(parser, args, defaults, tiny, at_least_one):
    """Give each flag left unset its default (--tiny's where --tiny sets one: explicit flags win), then refuse any
    of the flags `at_least_one` below 1, as a usage error."""
    preset = {**defaults, **(tiny if args.tiny else {})}
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    for k in at_least_one:
        if getattr(args, k) < 1:
            parser.error(f"--{k.replace('_', '-')} must be at least 1")
