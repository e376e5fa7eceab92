"""``python -m marlhf.view RESULTS.jsonl``: the macro actions of inference result files, in the
terminal and in HTML; forwards to :mod:`marlhf.inference.view`, where it lives."""

from marlhf.inference.view import main

if __name__ == "__main__":
    main()
