"""The model: the decoder and its layers, the architectures read from a Hugging Face
`config.json` (`registry.py` maps each `architectures` name to its reader, `rope.py` holds the
RoPE scaling rules, `moe.py` the routed-experts MLP), checkpoints, weights, tokenizers and
local model directories.
"""
