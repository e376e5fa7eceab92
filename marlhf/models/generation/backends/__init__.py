"""The generation backends, one module each, found by :mod:`marlhf.models.generation.registry`:
a module here defines ``BACKEND``, a :class:`~marlhf.models.generation.base.GenerationBackend`
subclass whose ``name`` is a value of ``--generation_backend``."""
