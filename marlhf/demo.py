"""``python -m marlhf.demo``, the documented entry point of the embedded pipeline: forwards to
:mod:`marlhf.pipeline.demo`, where it lives."""

from marlhf.pipeline.demo import main

if __name__ == "__main__":
    main()
