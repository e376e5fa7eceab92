"""``python -m marlhf.gpu_check``: see :mod:`marlhf.gpu_check`."""

import sys

from marlhf.gpu_check import main

sys.exit(main())
