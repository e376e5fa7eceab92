"""The built-in generation backends' implementations, one module each: a subclass of the backend's
declaration in :mod:`marlhf.models.generation.registry` that registers itself under the same name,
imported by the registry when the backend is first opened."""
