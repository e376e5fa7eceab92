"""``python -m marlhf.preflight STAGE [flags]``, the documented entry point of the pre-flight checks:
forwards to :mod:`marlhf.models.checks`, where they live."""

import sys

from marlhf.models.checks import main

if __name__ == "__main__":
    sys.exit(main())
