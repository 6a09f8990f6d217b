"""The trainer's side of the lake: rebuilding the exact model inputs of a sample
(:mod:`.inputs`) and measuring how far a model's logprobs are from the server's (:mod:`.gap`).

Importing this package needs neither torch nor transformers; the functions that build tensors
import them when called (a trainer's environment has them, the collector's need not).
"""
