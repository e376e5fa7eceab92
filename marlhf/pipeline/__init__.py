"""Programs over the stages: the embedded demo and its report, the pre-flight checks, the recipes
that make the shipped tiny models."""
