"""The tiny offline model's room: the shipped, warmed-up base (:mod:`trace_train.tiny.shipped`).

The build, the tokenizer and the warm-up still live in :mod:`trace_train.models`; they move here with the
layout change that DESIGN.md describes.
"""
