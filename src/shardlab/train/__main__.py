"""``python -m shardlab.train ...``: ``shardlab train`` as a module, for torchrun
(``torchrun --nproc-per-node N -m shardlab.train --dp N ...``). The command line is the
top floor: nothing imports this module, so it closes no import circle."""

import sys

from shardlab.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
