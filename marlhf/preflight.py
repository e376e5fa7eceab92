"""``python -m marlhf.preflight STAGE [flags]``, the documented entry point of the pre-flight checks:
forwards to :mod:`marlhf.pipeline.preflight`, where they live."""

import sys

from marlhf.pipeline.preflight import main

if __name__ == "__main__":
    sys.exit(main())
