"""Data layer: dataset adapters, the phase split, tokenisation with a cache, collators and the
bundled synthetic TL;DR task (see ``marlhf.data.synthetic`` for its gold scorer)."""
