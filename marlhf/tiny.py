"""``python -m marlhf.tiny``, the documented entry point that builds the embedded tiny models:
forwards to :mod:`marlhf.pipeline.recipes`, where their recipes live."""

from marlhf.pipeline.recipes import main

if __name__ == "__main__":
    main()
