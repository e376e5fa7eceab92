"""Models: loading causal LMs and tokenizers, LoRA, model and tokenizer checks, the embedded tiny
models, the reward model, log-probabilities, the static-cache decoder, the weights' EMA."""
