"""``python -m marlhf COMMAND``: the ``marlhf`` command (:mod:`marlhf.commands`)."""

import sys

from marlhf.commands import main

sys.exit(main())
